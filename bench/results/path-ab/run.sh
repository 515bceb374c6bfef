#!/bin/bash
# The path A/B of README.md: two rounds of `bench run`, new = 7899732, old = 7252573 (its
# parent), each from a worktree of its own beside this repository. As run on 2026-12-05, `new`
# was the working tree before 7899732 was committed and `old` the same tree with its changes
# stashed, in that order each round; the JSON files beside this script are what it wrote.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
commit_of() { if [ "$1" = new ]; then echo 7899732; else echo 7252573; fi; }
for code in new old; do
  tree="$root/../ab-$(commit_of $code)"
  [ -d "$tree" ] || git -C "$root" worktree add --detach "$tree" "$(commit_of $code)"
  make -C "$tree" .venv/.installed-stamp
done
mkdir -p "$root/bench/.logs/path-ab"
for round in 1 2; do
  for code in new old; do
    for router in prefix round-robin; do
      out="$code-$router-$round"
      (cd "$root/../ab-$(commit_of $code)" && .venv/bin/python -m bench run --workload system-prompts \
        --router $router --replicas 8 --rate 24 --seconds 60 --json "$root/bench/results/path-ab/$out.json") \
        > "$root/bench/.logs/path-ab/$out.log" 2>&1
    done
  done
done
