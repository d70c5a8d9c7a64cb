"""Helpers shared by the benchmarks' report.py scripts: JSON-line loading,
number formatting, ratios and the goal verdict table."""

import json


def load(paths, bench, key=lambda r: (r["impl"], r["name"])):
    """{key(record): record} (by default (impl, name)) from every JSON line
    with "bench": bench."""
    fig = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    r = json.loads(line)
                    if r.get("bench") == bench:
                        fig[key(r)] = r
    return fig


def fmt(v, spec):
    if v is None:
        return "-".rjust(int(spec.split(".")[0]))
    return format(v, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def print_goals(goals, ratios, width=58):
    """goals: (text, value, predicate); appends one record each to ratios."""
    for text, value, ok in goals:
        verdict = "n/a" if value is None else ("MET" if ok(value) else
                                               "NOT MET")
        print(f"{text:<{width}} {fmt(value, '6.2f')}  {verdict}")
        ratios.append(dict(goal=text, value=value, verdict=verdict))
