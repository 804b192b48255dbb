#!/bin/bash
# min3.sh : min-of-3 wall time of `spindle parse --format jsonl >/dev/null` on gen/CLASS.1048576, whole and c4
S=/tmp/review3/spindle; cd /tmp/review3/bench
for c in $(python3 gen.py list); do
  extra=""; case $c in sse_*) extra="--input sse";; attp*) extra="--profile attp";; tam*) extra="--profile tam";; action*) extra="--profile action";; esac
  for mode in whole c4; do ch=""; [ $mode = c4 ] && ch="--chunk-size 4"; best=99
    for i in 1 2 3; do t0=$(date +%s%N); $S parse gen/$c.1048576 $extra $ch --format jsonl >/dev/null 2>&1; t1=$(date +%s%N); t=$(( (t1-t0)/1000 )); [ $t -lt ${best}000000 ] && best_us=$t; [ $i = 1 ] && best_us=$t; [ $t -lt $best_us ] && best_us=$t; best=$((best_us/1000000+1)); done
    echo -e "$c\t$mode\t$best_us"
  done
done
