set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'churn.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 0.223 0.4465 0.9585 5.1775 9.8895
socketify 0.3275 0.5365 2.1135 8.5195 23.693
nchan 0.4505 0.9585 1.835 6.6194999999999995 10.779499999999999
hummingbird 0.688 1.327 4.7185 14.155999999999999 21.7895
python 0.5815 8.651 38.535 356.51599999999996 453.8465
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
$d57983 << EOD
"hub" 500.0
"socketify" 500.0
"nchan" 500.0
"hummingbird" 500.0
"python" 491.0
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
plot $d57983 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
