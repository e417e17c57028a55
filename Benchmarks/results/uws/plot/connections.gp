set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'connections.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,3
$d85944 << EOD
"hub" 4667.0
"uws" 4655.0
"socketify" 3776.0
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
plot $d85944 using 2:xtic(1) notitle lc rgb '#4477aa'
$d18299 << EOD
"hub" 0.84814453125
"uws" 1.09326171875
"socketify" 1.27587890625
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
plot $d18299 using 2:xtic(1) notitle lc rgb '#4477aa'
$d9104 << EOD
"hub" 105.25
"uws" 78.95
"socketify" 244.2
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
plot $d9104 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
