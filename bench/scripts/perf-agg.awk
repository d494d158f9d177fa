# perf script -F sw:comm,pid,ip,sym -F trace:comm,pid,event lines (bench/scripts/perf-recv.sh)
# → per process (comm/pid): CPU samples by symbol on stdout ("key n share sym",
# symbols of 1/3 % or more), and on stderr "samples key syscall=count ...".
{
  key = $1 "/" $2
  if ($3 ~ /:$/) { ev = $3; sub(/^syscalls:sys_enter_/, "", ev); sub(/:$/, "", ev); c[key] = c[key] " " ev; cnt[key " " ev]++; next }
  sym = $4; if (sym == "") sym = "?"
  n[key]++; s[key " " sym]++
}
END {
  for (k in cnt) { split(k, a, " "); evs[a[1]] = evs[a[1]] " " a[2] "=" cnt[k] }
  for (k in n) if (n[k] >= 20) print n[k], k, evs[k] > "/dev/stderr"
  for (k in s) { split(k, a, " "); if (n[a[1]] >= 20 && s[k] * 300 >= n[a[1]]) printf "%s %d %.1f%% %s\n", a[1], s[k], 100 * s[k] / n[a[1]], a[2] }
}
