set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'connections.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,3
$d41801 << EOD
"hub" 4760.0
"uws" 4779.0
"socketify" 3460.0
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
plot $d41801 using 2:xtic(1) notitle lc rgb '#4477aa'
$d28342 << EOD
"hub" 0.8603515625
"uws" 1.09375
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
plot $d28342 using 2:xtic(1) notitle lc rgb '#4477aa'
$d16611 << EOD
"hub" 120.25
"uws" 83.65
"socketify" 266.85
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
plot $d16611 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
