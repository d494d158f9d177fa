#!/usr/bin/env python3
"""Issue 3's targets over several hydra-bench tables of one code.

    bench/scripts/targets-summary.py TABLE.md...

Runs of one code on one machine (and more so on two fresh machines) differ
by more than a target's margin, so a verdict takes several tables. For each
case of the shm plane the tables' target rows name (transport, direction,
chunk), it prints the ratio to raw of every table, their median, and in how
many tables the ratio met its target; then how many cases meet their target
at the median. Tables with a second raw server (hydra-bench --raw-server
A,B) give the engine's ratio to it in a last column: its median is printed
beside, for comparison; the verdicts are the first server's.
"""
import re
import statistics
import sys


def rows(path):
    """(case, ratio, target, ratio to a second raw server or None) for each
    measured shm row of a table's targets."""
    out = []
    for line in open(path, encoding='utf-8'):
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if len(cells) not in (10, 11) or cells[0] != 'shm':
            continue
        try:
            ratio = float(cells[4])
        except ValueError:
            continue  # not measured
        target = float(re.sub(r'[^0-9.]', '', cells[5]))
        other = float(cells[10]) if len(cells) == 11 else None
        out.append(((cells[1], cells[2], cells[3]), ratio, target, other))
    return out


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    cases, targets, others, tables = {}, {}, {}, []
    for p in paths:
        found = rows(p)
        if not found:
            print(f'{p}: no measured shm target rows', file=sys.stderr)
            return 1
        tables.append(found)
        for case, ratio, target, other in found:
            cases.setdefault(case, []).append(ratio)
            targets[case] = target
            if other is not None:
                others.setdefault(case, []).append(other)
    met_at_median = 0
    print(f'{len(paths)} tables: ' + ', '.join(paths))
    for case, ratios in cases.items():
        med, target = statistics.median(ratios), targets[case]
        met = sum(r >= target for r in ratios)
        met_at_median += med >= target
        print('%-13s %-9s %-8s  %s  median %.3f (>= %.2f: %s)  met in %d of %d' % (
            *case, ' '.join('%.3f' % r for r in ratios), med, target, 'yes' if med >= target else 'no', met, len(ratios)), end='')
        if case in others:
            o = others[case]
            print('  | to the second raw server: %s  median %.3f, >= %.2f in %d of %d' % (
                ' '.join('%.3f' % r for r in o), statistics.median(o), target, sum(r >= target for r in o), len(o)), end='')
        print()
    print(f'cases met at the median: {met_at_median} of {len(cases)}; per table: ' +
          ', '.join(f'{sum(r >= t for _, r, t, _ in found)} of {len(found)}' for found in tables))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
