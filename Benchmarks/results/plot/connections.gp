set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'connections.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,3
$d40002 << EOD
"hub" 4670.5
"socketify" 4684.0
"nchan" 4673.0
"hummingbird" 3033.0
"python" 1119.0
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
plot $d40002 using 2:xtic(1) notitle lc rgb '#4477aa'
$d58338 << EOD
"hub" 1.45751953125
"socketify" 1.27783203125
"nchan" 14.03076171875
"hummingbird" 36.18701171875
"python" 16.09814453125
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
plot $d58338 using 2:xtic(1) notitle lc rgb '#4477aa'
$d97485 << EOD
"hub" 94.7
"socketify" 200.0
"nchan" 67.65
"hummingbird" 363.2
"python" 554.5
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
plot $d97485 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
