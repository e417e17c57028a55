set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'publish.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$d6820 << EOD
"hub" 291934.0
"nchan" 46930.0
"hummingbird" 96332.0
"python" 67154.0
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
plot $d6820 using 2:xtic(1) notitle lc rgb '#4477aa'
$d24077 << EOD
"hub" 3.75
"nchan" 23.04
"hummingbird" 17.03
"python" 14.82
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
plot $d24077 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
