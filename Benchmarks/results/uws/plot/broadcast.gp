set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'broadcast.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 126.87799999999999 190.841 249.561 297.7955 341.3595
uws 167.772 205.521 230.6865 266.33799999999997 280.776
socketify 171.9665 211.8125 232.784 257.95000000000005 266.5655
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
$d74889 << EOD
"hub" 0.985
"uws" 1.11
"socketify" 1.17
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
plot $d74889 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
