set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'publish.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$d31685 << EOD
"hub" 257738.0
"nchan" 33296.0
"hummingbird" 71145.0
"python" 49177.0
EOD
set title "publishes/s accepted and replied"
set ylabel 'per second'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d31685 using 2:xtic(1) notitle lc rgb '#4477aa'
$d48887 << EOD
"hub" 3.9
"nchan" 22.66
"hummingbird" 17.24
"python" 16.75
EOD
set title "server CPU per publish"
set ylabel 'µs'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d48887 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
