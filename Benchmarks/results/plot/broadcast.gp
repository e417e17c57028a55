set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'broadcast.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 142.606 230.687 310.378 369.099 443.908
nchan 6308.233 12348.031 13958.644 14328.307 14328.307
hummingbird 1375.732 2281.701 4563.403 4697.62 4736.884
python 1879.048 2147.484 2550.137 2617.246 2624.551
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
$d86594 << EOD
"hub" 0.98
"nchan" 13.88
"hummingbird" 11.73
"python" 11.22
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
plot $d86594 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
