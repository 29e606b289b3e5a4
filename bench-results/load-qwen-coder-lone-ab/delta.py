"""What each run changed in the services' counters: python3 delta.py DIR TAG [TAG ...] reads
DIR/before-TAG.txt and DIR/after-TAG.txt (run.sh's scrapes) and prints one column per tag."""
import sys


def load(path):
    values = {}
    for line in open(path):
        if line.startswith("#") or " " not in line:
            continue
        key, value = line.rsplit(" ", 1)
        try:
            values[key] = float(value)
        except ValueError:
            pass
    return values


folder, tags = sys.argv[1], sys.argv[2:]
deltas = {}
for tag in tags:
    before, after = load(f"{folder}/before-{tag}.txt"), load(f"{folder}/after-{tag}.txt")
    deltas[tag] = {key: value - before.get(key, 0.0) for key, value in after.items()}
for key in sorted(set().union(*deltas.values())):
    values = [deltas[tag].get(key, 0.0) for tag in tags]
    if any(values) and key.rsplit("{", 1)[0].endswith(("_total", "_sum", "_count")):
        print(key, *(f"{v:.1f}" for v in values))
