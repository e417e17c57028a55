set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'connections.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,3
$d20562 << EOD
"hub" 4675.0
"uws" 4674.0
"socketify" 4668.5
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
plot $d20562 using 2:xtic(1) notitle lc rgb '#4477aa'
$d31958 << EOD
"hub" 0.8427734375
"uws" 1.0927734375
"socketify" 1.27734375
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
plot $d31958 using 2:xtic(1) notitle lc rgb '#4477aa'
$d18421 << EOD
"hub" 60.8
"uws" 57.6
"socketify" 201.05
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
plot $d18421 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
