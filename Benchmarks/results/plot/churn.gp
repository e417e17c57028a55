set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'churn.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 0.164 0.344 0.573 0.737 1.416
nchan 0.295 0.541 0.803 1.868 4.745
hummingbird 0.655 1.147 1.802 2.49 4.088
python 0.451 2.163 23.593 293.601 322.053
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
$d59379 << EOD
"hub" 500.0
"nchan" 500.0
"hummingbird" 500.0
"python" 495.0
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
plot $d59379 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
