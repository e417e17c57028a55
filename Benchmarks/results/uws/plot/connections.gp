set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'connections.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,3
$d97739 << EOD
"hub" 4675.0
"uws" 4672.5
"socketify" 4672.0
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
plot $d97739 using 2:xtic(1) notitle lc rgb '#4477aa'
$d61408 << EOD
"hub" 0.83837890625
"uws" 1.0927734375
"socketify" 1.2763671875
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
plot $d61408 using 2:xtic(1) notitle lc rgb '#4477aa'
$d95282 << EOD
"hub" 71.3
"uws" 57.6
"socketify" 200.8
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
plot $d95282 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
