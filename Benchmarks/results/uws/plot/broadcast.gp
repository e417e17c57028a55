set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'broadcast.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 213.90949999999998 369.099 503.3165 595.5915 678.88
uws 205.52100000000002 260.0465 297.7955 322.9615 327.541
socketify 216.007 276.824 335.544 369.099 393.5325
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
$d30132 << EOD
"hub" 1.065
"uws" 1.4
"socketify" 1.525
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
plot $d30132 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
