"""sim replays the Alibaba GPU trace (openb) through the real scheduling core: no server, no
agents. It is `arranger simulate` and bench/fragmentation.py.

- trace: the openb CSV files as NodeInfo and PodRequest.
- protocol: the FGD paper's experiment (arrival order, inflation, metrics) and the run loop.
- fragmentation: FGD's expected-fragmentation measure, vectorised over nodes.
- policies: the paper's baselines (Random, DotProd, GpuPacking, BestFit, FGD) as core plugins.
- main: the command line.
"""
