set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'connections.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,3
$d3858 << EOD
"hub" 4668.5
"uws" 4666.5
"socketify" 3604.5
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
plot $d3858 using 2:xtic(1) notitle lc rgb '#4477aa'
$d87348 << EOD
"hub" 0.84130859375
"uws" 1.0927734375
"socketify" 1.275390625
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
plot $d87348 using 2:xtic(1) notitle lc rgb '#4477aa'
$d56749 << EOD
"hub" 93.15
"uws" 80.75
"socketify" 239.5
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
plot $d56749 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
