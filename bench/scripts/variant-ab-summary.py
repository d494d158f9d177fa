#!/usr/bin/env python3
"""Summarise the engine logs of `bench/scripts/gpu-bench.sh variant-ab` (debug level).

    variant-ab-summary.py DIR   # DIR holds engine-NAME.log

One line per variant, transport, chunk size and direction, for each run of
consecutive transfers with those: median GB/s, the median share of a transfer
the host waited on the plugin (the host's "state transfer" lines), and for
restores the llama plugin's prefetcher: the share llama.cpp's thread waited
for bytes (the data plane set the pace), the share the reader waited for
room (the uploads did) and the share spent re-evaluating the last token
after the bytes (where logged), from its "state put" lines.
"""
import glob
import re
import statistics as st
import sys

UNITS = {'ns': 1e-9, 'µs': 1e-6, 'us': 1e-6, 'ms': 1e-3, 's': 1.0}


def seconds(d):
    """A Go duration string (1.5s, 300ms, 1m2.5s) in seconds."""
    total, found = 0.0, False
    for num, unit in re.findall(r'([0-9.]+)(ns|µs|us|ms|m|h|s)', d):
        total += float(num) * {'m': 60.0, 'h': 3600.0}.get(unit, UNITS.get(unit, 0))
        found = True
    return total if found else float('nan')


def fields(line):
    return dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line))


def main(d):
    for f in sorted(glob.glob(d + '/engine-*.log')):
        name = f.rsplit('engine-', 1)[1][:-len('.log')]
        host, plug = [], []
        for line in open(f, errors='replace'):
            if 'state transfer:' in line:
                g = fields(line)
                if g.get('error') != '<nil>':
                    continue
                host.append(((g['direction'], g.get('network', '?'), int(g['chunk'])),
                             int(g['bytes']) / float(g['seconds']) / 1e9,
                             float(g['backend_wait_seconds']) / float(g['seconds'])))
            elif 'state put:' in line and 'wait_data=' in line:
                g = fields(line)
                el = seconds(g['elapsed'])
                plug.append((seconds(g['wait_data']) / el, seconds(g['wait_space']) / el,
                             seconds(g['reeval']) / el if 'reeval' in g else float('nan')))
        runs = []
        for h in host:
            if runs and runs[-1][0][0] == h[0]:
                runs[-1].append(h)
            else:
                runs.append([h])
        pi = 0
        for run in runs:
            (direction, network, chunk), n = run[0][0], len(run)
            extra = ''
            if direction == 'put':
                p = plug[pi:pi + n]
                pi += n
                if p and len(run) > 1:
                    re_ = st.median(x[2] for x in p)
                    extra = '  plugin waits: data %3.0f%%  room %3.0f%%  reeval %s' % (
                        100 * st.median(x[0] for x in p), 100 * st.median(x[1] for x in p),
                        '  —' if re_ != re_ else '%3.0f%%' % (100 * re_))
            if n < 2:
                continue  # the benchmark's set-up transfers
            print('%-10s %-4s %8d %-3s %5.2f GB/s  host waits on plugin %3.0f%%%s' % (
                name, network, chunk, direction, st.median(x[1] for x in run),
                100 * st.median(x[2] for x in run), extra))


if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else 'out')
