"""Several environment processes: world w lives in child w % k, and a round's tool calls run in parallel across the
children, in order within each world (a helper's post still reaches main in the same round).

    pool = EnvPool("my_module:MyEnv", workers=4, timeout_s=30)   # four EnvHost children, started together
    pool.call_many([(0, "run_tests", {...}), (1, "run_tests", {...}), ...])   # worlds 0 and 1 at once
    # everything else as EnvHost: tools, tools_for, reset, call, view, rewards, agent_rewards, close

`tool_workers` in the config (kit/engine/tools.py sampler_for). A slow tool (CodeTests' run_tests runs a program in
the sandbox) then costs a round the slowest world's calls, not the sum of all of them. A timeout restarts only the
child of that world, so the worlds of the other children keep their state. The tools' results are the same as with
one child when each world's instance depends only on its own calls (an environment that draws from the process's
global random state draws from k of them).

May import: the standard library and kit.sandbox.envhost.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, wait

from kit.sandbox import envhost
from kit.sandbox.envhost import EnvHost, EnvView


class EnvPool:
    """k EnvHost children with EnvHost's interface (see the module docstring)."""

    def __init__(self, spec, workers: int, **host_args):
        if workers < 1:
            raise ValueError(f"workers={workers}: give an integer >= 1")
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix="kit-env")
        starts = [self._threads.submit(envhost.EnvHost, spec, **host_args) for _ in range(workers)]
        self.hosts: list[EnvHost] = []
        try:
            for start in starts:
                self.hosts.append(start.result())
        except BaseException:
            for start in starts:  # the ones that did start
                if start.exception() is None:
                    start.result().close()
            self._threads.shutdown()
            raise
        first = self.hosts[0]
        self.spec, self.tools, self.by_role = first.spec, first.tools, first.by_role
        self.has_reward, self.has_agent_rewards = first.has_reward, first.has_agent_rewards
        self.tool_seconds = 0.0  # wall time of the rounds' calls (perf/tool_s), not the children's sum

    @property
    def restarts(self) -> int:
        return sum(h.restarts for h in self.hosts)

    def host_of(self, world: int) -> EnvHost:
        return self.hosts[world % len(self.hosts)]

    def tools_for(self, role: str) -> dict[str, dict]:
        return self.hosts[0].tools_for(role)

    def _each_child(self, items: list, run) -> list:
        """run(host, [(position, item), ...]) -> results in that order, for every child's share of `items` (item[0]
        is its world) at once; the results back in the items' order."""
        shares: dict[int, list] = {}
        for position, item in enumerate(items):
            shares.setdefault(item[0] % len(self.hosts), []).append((position, item))
        futures = {k: self._threads.submit(run, self.hosts[k], [item for _, item in share])
                   for k, share in shares.items()}
        wait(futures.values())  # every child's share done (or failed) before any error is raised: none still runs
        out = [None] * len(items)
        for k, share in shares.items():
            for (position, _), value in zip(share, futures[k].result()):
                out[position] = value
        return out

    def reset(self, rows: list[dict], seeds: list[int] | None = None) -> list[str | None]:
        seeds = seeds or [None] * len(rows)
        return self._each_child([(w, r, s) for w, (r, s) in enumerate(zip(rows, seeds))],
                                lambda host, share: [host.reset_world(w, r, s) for w, r, s in share])

    def call(self, world: int, name: str, arguments, caller: str | None = None) -> str:
        return self.call_many([(world, name, arguments, caller)])[0]

    def call_many(self, calls: list[tuple]) -> list[str]:
        t0 = time.perf_counter()
        try:
            return self._each_child(list(calls), lambda host, share: host.call_many(share))
        finally:
            self.tool_seconds += time.perf_counter() - t0

    def view(self, world: int) -> EnvView:
        return EnvView(self.host_of(world), world)

    def rewards(self, worlds: list[int]) -> list[float]:
        return self._each_child([(w,) for w in worlds], lambda host, share: host.rewards([w for w, in share]))

    def agent_rewards(self, worlds: list[int], roles: list[str]) -> list[list[float]]:
        return self._each_child([(w,) for w in worlds],
                                lambda host, share: host.agent_rewards([w for w, in share], roles))

    def close(self) -> None:
        for host in self.hosts:
            host.close()
        self._threads.shutdown()
