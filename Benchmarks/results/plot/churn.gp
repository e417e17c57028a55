set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'churn.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 0.193 0.393 0.942 3.899 10.309000000000001
socketify 0.28300000000000003 0.4505 1.1145 7.3405 16.75
nchan 0.4175 0.893 1.737 6.0295000000000005 11.4935
hummingbird 0.647 1.327 4.7515 10.3545 26.033
python 0.43 2.294 25.428 301.99 354.7345
EOD
set title "stable clients' latency under churn"
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
$d30059 << EOD
"hub" 500.0
"socketify" 500.0
"nchan" 500.0
"hummingbird" 500.0
"python" 493.0
EOD
set title "churn handshakes completed/s"
set ylabel 'per second'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d30059 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
