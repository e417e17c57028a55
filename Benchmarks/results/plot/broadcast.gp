set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'broadcast.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 301.99 704.643 1056.965 1207.96 1287.264
nchan 6576.669 12348.031 14227.079 14457.481 14457.481
hummingbird 2147.484 5100.274 7784.628 8053.064 8123.258
python 1912.603 2617.246 2952.79 2993.344 2993.344
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
$d48026 << EOD
"hub" 0.74
"nchan" 14.7
"hummingbird" 11.58
"python" 10.37
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
plot $d48026 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
