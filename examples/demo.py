"""`make demo`: the reach example end to end on the local stack.

Creates fresh topics, produces sample tweets and follower counts, runs the
ReachProcessor until every input partition is consumed, and prints a summary of the
output, the committed offsets, and where the metrics were served.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from reach import FOLLOWERS, REACH, TWEETS, ReachProcessor, produce_sample, summarise

from kasper_py import Config, TopicProcessor
from kasper_py.stack import kafka_bootstrap

TWEET_COUNT = 20_000
METRICS_PORT = int(os.environ.get("KASPER_DEMO_METRICS_PORT", "9400"))


def main() -> int:
    bootstrap = kafka_bootstrap()
    prefix = f"demo-{uuid.uuid4().hex[:6]}-"
    print(f"kasper_py demo on {bootstrap}: topics {prefix}{{{TWEETS},{FOLLOWERS},{REACH}}}")
    followers = produce_sample(bootstrap, prefix, partitions=4, tweets=TWEET_COUNT)
    print(f"produced {len(followers)} follower counts and {TWEET_COUNT} tweets on 4 partitions")
    config = Config(name=f"{prefix}reach", bootstrap_servers=bootstrap,
                    input_topics=(prefix + TWEETS, prefix + FOLLOWERS), batch_size=50_000,
                    batch_wait=2.0, key_serde="str", value_serde="json",
                    metrics_port=METRICS_PORT,
                    max_latency=None)  # classic batches: followers and tweets read together
    processor = TopicProcessor(config, lambda c: ReachProcessor(c, prefix))
    started = time.perf_counter()
    processor.run_loop(until_caught_up=True)
    elapsed = time.perf_counter() - started
    committed = processor.committed_offsets()
    processor.close()
    summary = summarise(bootstrap, prefix + REACH, TWEET_COUNT, followers=followers)
    print(f"ran ReachProcessor over 4 partitions to the end of its input in {elapsed:.1f}s")
    print(f"committed offsets (group {config.group}): "
          + ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(committed.items())))
    print("output summary:", json.dumps(summary, indent=2))
    # Follower counts were written before the tweets, so every tweet meets its count.
    ok = summary["reach_messages"] == TWEET_COUNT and summary["wrong_reach"] == 0
    print(f"every tweet has its reach: {ok} ({summary['reach_messages']}/{TWEET_COUNT})")
    print(f"metrics were served at http://127.0.0.1:{METRICS_PORT}/metrics while it ran "
          f"(health at /health/live and /health/ready)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
