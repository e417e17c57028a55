set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'connections.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,3
$d87360 << EOD
"hub" 4662.0
"nchan" 4486.0
"hummingbird" 2582.0
"python" 1109.0
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
plot $d87360 using 2:xtic(1) notitle lc rgb '#4477aa'
$d81016 << EOD
"hub" 1.794921875
"nchan" 14.0322265625
"hummingbird" 36.169921875
"python" 16.107421875
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
plot $d81016 using 2:xtic(1) notitle lc rgb '#4477aa'
$d15959 << EOD
"hub" 66.3
"nchan" 45.1
"hummingbird" 318.9
"python" 604.8
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
plot $d15959 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
