set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'connections.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,3
$d59674 << EOD
"hub" 4669.0
"socketify" 4669.5
"nchan" 4670.0
"hummingbird" 2943.5
"python" 1128.5
EOD
set title "handshakes/s during the ramp"
set ylabel 'per second'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d59674 using 2:xtic(1) notitle lc rgb '#4477aa'
$d65626 << EOD
"hub" 0.97412109375
"socketify" 1.27783203125
"nchan" 14.03369140625
"hummingbird" 36.171875
"python" 16.09033203125
EOD
set title "RSS per connection"
set ylabel 'KiB'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d65626 using 2:xtic(1) notitle lc rgb '#4477aa'
$d30733 << EOD
"hub" 98.95
"socketify" 200.3
"nchan" 73.45
"hummingbird" 414.25
"python" 573.1
EOD
set title "server CPU per handshake"
set ylabel 'µs'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d30733 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
