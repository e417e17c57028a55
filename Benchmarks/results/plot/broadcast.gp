set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'broadcast.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 165.675 283.1155 385.876 452.985 518.703
socketify 178.2575 226.4925 270.533 297.7955 306.7635
nchan 6979.3215 12482.249 13824.426 14143.072 14301.937
hummingbird 2382.3645 4362.076 8187.281499999999 8271.554 8282.086
python 2248.147 2986.3445 3456.1065 3535.053 3535.053
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
$d78246 << EOD
"hub" 1.05
"socketify" 1.25
"nchan" 18.6
"hummingbird" 17.005
"python" 14.09
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
plot $d78246 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
