#!/bin/bash
cd /work/main
for round in 1 2; do
  for code in new old; do
    if [ $code = old ]; then git stash -q; fi
    for router in prefix round-robin; do
      .venv/bin/python -m bench run --workload system-prompts --router $router --replicas 8 --rate 24 --seconds 60 --json /tmp/ab/$code-$router-$round.json > /tmp/ab/$code-$router-$round.log 2>&1
    done
    if [ $code = old ]; then git stash pop -q; fi
  done
done
echo done
