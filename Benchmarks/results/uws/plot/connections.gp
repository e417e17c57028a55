set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'connections.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,3
$d54678 << EOD
"hub" 4665.5
"uws" 4654.5
"socketify" 3936.5
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
plot $d54678 using 2:xtic(1) notitle lc rgb '#4477aa'
$d75269 << EOD
"hub" 0.857421875
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
plot $d75269 using 2:xtic(1) notitle lc rgb '#4477aa'
$d56733 << EOD
"hub" 105.0
"uws" 79.69999999999999
"socketify" 238.95
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
plot $d56733 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
