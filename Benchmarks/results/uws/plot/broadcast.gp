set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'broadcast.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 192.938 331.35 457.1795 545.2595 612.2105
uws 199.2295 255.85250000000002 301.99 331.35 344.85749999999996
socketify 180.35500000000002 232.7835 297.7955 335.54449999999997 346.757
EOD
set title "publish-to-receive latency, all deliveries"
set ylabel 'ms (log scale)'
set logscale y
set yrange [*:*]
set format y '%g'
set style data histograms
set style histogram clustered gap 1
set boxwidth 0.9
set xtics rotate by -25
plot for [i=2:6] $lat using i:xtic(1) title columnheader(i)
unset logscale y
$d82724 << EOD
"hub" 1.05
"uws" 1.295
"socketify" 1.31
EOD
set title "server CPU per delivery"
set ylabel 'µs'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d82724 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
