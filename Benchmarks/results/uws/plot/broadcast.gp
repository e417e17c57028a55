set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'broadcast.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 134.218 201.3265 257.9495 314.5725 373.8855
uws 167.772 205.52100000000002 228.5895 247.464 255.5365
socketify 167.772 207.61849999999998 226.4925 247.464 262.9735
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
$d59541 << EOD
"hub" 0.99
"uws" 1.09
"socketify" 1.1400000000000001
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
plot $d59541 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
