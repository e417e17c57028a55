set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'broadcast.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 230.687 394.2645 520.0935 591.3969999999999 663.204
uws 232.784 301.99 343.933 369.099 386.02700000000004
socketify 220.20100000000002 285.2125 327.15549999999996 356.51599999999996 362.6495
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
$d87195 << EOD
"hub" 1.07
"uws" 1.6749999999999998
"socketify" 1.575
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
plot $d87195 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
