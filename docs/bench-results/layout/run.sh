#!/bin/bash
# Against a durable cluster on a Unix socket in /tmp/lay, port 55432 (initdb defaults,
# shared_buffers 512MB, max_wal_size 4GB).
P="psql -q -h /tmp/lay -p 55432 -U postgres"
PB="/usr/lib/postgresql/15/bin/pgbench -h /tmp/lay -p 55432 -U postgres -n postgres"
for spec in "256 200000" "1024 100000" "2048 100000" "4096 50000" "65536 5000"; do
  set -- $spec; sz=$1; n=$2
  $P -v sz=$sz -f setup.sql >/dev/null 2>&1
  for L in a b c; do
    $P -c CHECKPOINT
    t0=$(date +%s.%N)
    pub=$($PB -c 4 -j 2 -t $((n/400)) -f pub_$L.sql 2>&1 | grep -oP 'tps = \K[0-9.]+' | head -1)
    t1=$(date +%s.%N)
    sq=$($PB -c 1 -t $((n/1000)) -f seq_$L.sql 2>&1 | grep -oP 'tps = \K[0-9.]+' | head -1)
    t2=$(date +%s.%N)
    rd=$($PB -c 1 -t 100 -f read_$L.sql 2>&1 | grep -oP 'tps = \K[0-9.]+' | head -1)
    left=$($P -Atc "select count(*) from $( [ $L = c ] && echo 'c.msg where seq is null' || echo $L.pending)")
    sizes=$($P -Atc "select pg_size_pretty(sum(pg_total_relation_size(c.oid))) from pg_class c join pg_namespace n on n.oid=c.relnamespace where n.nspname='$L' and c.relkind='r'")
    awk -v sz=$sz -v L=$L -v pub=$pub -v sq=$sq -v rd=$rd -v t0=$t0 -v t2=$t2 -v left=$left -v sizes="$sizes" 'BEGIN{printf "%6s %s publish %8.0f msg/s  sequence %8.0f msg/s  read %8.0f msg/s  publish+sequence %6.2fs  left %s  size %s\n", sz, L, pub*100, sq*1000, rd*1000, t2-t0, left, sizes}'
  done
done
