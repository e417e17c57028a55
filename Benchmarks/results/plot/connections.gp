set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'connections.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,3
$d20522 << EOD
"hub" 4676.0
"nchan" 4679.0
"hummingbird" 3569.0
"python" 1242.0
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
plot $d20522 using 2:xtic(1) notitle lc rgb '#4477aa'
$d26260 << EOD
"hub" 1.2724609375
"nchan" 14.033203125
"hummingbird" 36.181640625
"python" 16.0498046875
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
plot $d26260 using 2:xtic(1) notitle lc rgb '#4477aa'
$d16874 << EOD
"hub" 83.2
"nchan" 54.7
"hummingbird" 342.6
"python" 496.4
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
plot $d16874 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
