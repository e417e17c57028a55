set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'broadcast.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 161.481 308.2815 419.4305 494.9275 551.005
socketify 176.161 230.6865 281.0185 306.18399999999997 311.8435
nchan 7449.0835 12616.4665 13891.466 13891.466 13891.466
hummingbird 2315.2555 4630.5115000000005 6643.7775 6874.342500000001 6883.3330000000005
python 2818.572 3556.7695000000003 3959.4230000000002 3995.6135 3995.6135
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
$d97867 << EOD
"hub" 1.105
"socketify" 1.27
"nchan" 19.79
"hummingbird" 15.17
"python" 16.645
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
plot $d97867 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
