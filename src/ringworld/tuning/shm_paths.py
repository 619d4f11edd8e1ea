"""Where the shared-memory collectives leave their windows for direct copies: the measured
sizes, as the :class:`~ringworld.algorithms.shm_policy.Policy` every arena is handed.

Direct copies (the kernel reading or writing a peer's buffer: one copy instead of two through
the windows) run at 3-5 GB/s here: below two in-cache copies for smaller blocks, ahead once
blocks leave the cache. Measured on the reference VM (2 cores), same-job A/Bs:

* alltoall (bytes of the send buffer): from 1 MiB where ranks have cores of their own. The
  windows' copies between cores ran 2-3x slower in most jobs (np=2, 1 MiB: windows 280-311 us
  in four jobs of five and 102 in the fifth, direct reads 140-162 in all five). Where ranks
  share cores, wherever the slots stop (over 256 KiB): np=4 on 2 cores, same job, windows
  against direct, medians of 7: send buffers of 320 KiB 151 us against 112 (1.36x), 384 KiB
  1.43x, 512 KiB 1.40x, 1 MiB 1.27x, 2 MiB 1.20x (measured after the direct copies' per-call
  cost fell by 2.6 us; before, from 4 MiB: 1 MiB 0.49-0.75 ms against 0.61-0.72, 4 MiB
  3.0-3.5 ms against 2.2-2.5).
* bcast: the root writes 1/p of the data into each other rank while they read the rest, so
  both sides copy at once (on two ranks they share the pieces out as they go). Where ranks have
  cores of their own, from 192 KiB, ahead of the root's eager ring below EAGER_MAX and of the
  streamed broadcast above it. Same job, medians of 9, np=2: ring against direct 128 KiB 9.5
  us against 10.4, 160 KiB 11.6 against 11.4, 192 KiB 16.1 against 11.8, 256 KiB 18.3
  against 12.9 (beside a busy process: 192 KiB 36 against 25); the stream against direct
  320 KiB 43 us against 15, 512 KiB 51 against 18, 768 KiB 72 against 24 (before this, direct
  from 1 MiB: 1 MiB 0.11 ms against 0.12, 16 MiB 2.1-2.6 ms against 2.8-3.9). Ranks that share
  cores: from 1 MiB (np=4 on 2 cores, the stream against direct: 320 KiB 1.09x, 512 KiB 0.99x,
  768 KiB 1.12x).
* allgather (bytes per block): as alltoall (np=2, 1 MiB: windows 283-310 us in four jobs of
  five and 107 in the fifth, direct 148-185), from 512 KiB; on shared cores from 2 MiB (np=4
  on 2 cores, 2 MiB: windows 0.70-0.97 ms against 0.89-1.23, 4 MiB 2.0-2.4 against 2.0-2.1).
* reduce_scatter_block (bytes per block): each rank reads its block of the others' inputs and
  combines them in rank order (np=2, five jobs at 1 MiB: direct 179-209 us, windows 265-287 in
  four and 137 in the fifth; from 16 MiB a tie), from 512 KiB. On shared cores never: direct
  copies gain nothing when the ranks take turns on one core.
* allreduce: from 8 MiB each rank reads its slice of the others' inputs and then the others'
  results straight from their buffers.
* gather and scatter (bytes per block): direct wherever the eager rings and the slots stop,
  for ranks with cores of their own and ranks that share them: the others write their block
  into the root's recvbuf or read theirs from its sendbuf, where the windows' path copies every
  block twice, one chunk and two syncs at a time. Same job, windows against direct, medians of
  7 alternating rounds: np=2 scatter 136 KiB blocks 38.5 us against 16.1 (2.39x), 256 KiB 2.30x,
  384 KiB 2.74x; gather 272 KiB 1.76x, 384 KiB 1.99x; np=4 on 2 cores scatter 128 KiB 1.41x,
  256 KiB 1.80x, 1 MiB 2.28x; gather 512 KiB 1.92x, 1 MiB 2.01x; np=8 on 2 cores scatter 40
  KiB 1.14x, 64 KiB 1.36x. (Before, from 512 KiB and on shared cores from 2 MiB, as allgather:
  not measured apart. Scatter's blocks under 32 KiB, which only leave the ring beyond 8
  ranks, stay in the windows: not measured.) A gather's direct path goes before the rings
  and slots from 112 KiB blocks where ranks have cores of their own: np=2, the rings against
  direct, 96 KiB 11.6 us against 15.9, 112 KiB 12.8 against 12.4, 128 KiB 14.3 against 13.3,
  256 KiB 26.6 against 18.0 (a scatter's ring against direct: 96 KiB blocks 0.91x, 112 KiB
  1.27x, 128 KiB 1.33x; not changed: its ring holds all p blocks, and p > 2 is not measured).
  Large blocks (np=2, 4 MiB) 155-258 us against the linear schedule's 337-512; 16-64 MiB
  blocks a tie with it. Where ranks share cores a gather's direct path goes before the rings
  from 128 KiB blocks (it took the rings up to EAGER_MAX): np=4 on 2 cores, same job, the
  rings against direct, 112 KiB 1.00x, 128 KiB 1.16x, 192 KiB 1.98x, 256 KiB 1.61x; np=8 112
  KiB 1.29x, 128 KiB 1.51x, 256 KiB 2.01x; np=3 (two or three ranks on a core by turns) noisy:
  128 KiB 0.52-1.00x in three jobs, 192 KiB 0.96-1.43x, 256 KiB 0.75-1.67x.

Races: where both paths may win, rank 0 times them as they run and every rank takes the faster
(see ``Arena.race``): on the reference VM the window copies between cores ran at one speed in
some jobs (np=2, 1 MiB alltoall: windows 110-148 us, direct 152-174) and 2-3x slower in others,
or later in the same job (windows 330-400 us). Raced from half the direct threshold of
non-crowded jobs, up to 8 MiB (exclusive): from there the windows lost by 2x in every same-job
measurement (np=2, 8 and 16 MiB: allgather, reduce_scatter_block and alltoall, windows 1.4-2.2
ms against direct 0.75-1.1 at 16 MiB), while the race's tries of them cost 2-5% of the time.
Crowded jobs do not race: ranks taking turns on the cores copy at one core's speed either way
(np=4 on 2 cores, 1 MiB, same job: raced 0.59-0.96 ms, direct 0.57-0.98, windows 0.57-0.93;
the race only added its tries).
"""

from __future__ import annotations

import math

from ringworld.algorithms.shm_policy import Policy

_DIRECT = {"allreduce": 8 << 20, "bcast": 192 << 10, "allgather": 512 << 10,
           "alltoall": 1 << 20, "reduce_scatter_block": 512 << 10, "gather": 112 << 10,
           "scatter": 32 << 10}

#: the measured policy (see the module docstring)
DEFAULT = Policy(
    direct=_DIRECT,
    direct_crowded={"alltoall": 256 << 10, "allgather": 2 << 20, "bcast": 1 << 20,
                    "reduce_scatter_block": math.inf, "gather": 128 << 10},
    race_min={c: _DIRECT[c] // 2 for c in ("alltoall", "allgather", "reduce_scatter_block")},
    race_max=8 << 20,
)
