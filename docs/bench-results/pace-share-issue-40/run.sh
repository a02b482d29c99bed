#!/bin/bash
cd /work/main
for i in 1 2 3; do
  for v in 80 40; do
    echo "=== run $i share $v start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    flock /tmp/outbox-heavy.lock /tmp/ob$v -phases compare,latency -per-tx 1 -messages 100000 -publish-rounds 0 -latency-loads 1000,100 -systems ceiling,outbox,outbox-wal -out /tmp/pace/s$v-r$i > /tmp/pace/s$v-r$i.log 2>&1
    echo "=== run $i share $v end $(date -u +%T) rc $?"
  done
done
