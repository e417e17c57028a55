set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'connections.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,3
$d66918 << EOD
"hub" 4667.5
"uws" 4666.5
"socketify" 4641.0
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
plot $d66918 using 2:xtic(1) notitle lc rgb '#4477aa'
$d11557 << EOD
"hub" 0.84423828125
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
plot $d11557 using 2:xtic(1) notitle lc rgb '#4477aa'
$d19143 << EOD
"hub" 96.85
"uws" 75.0
"socketify" 211.35
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
plot $d19143 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
