"""CPU kernels for few-row forwards (speculative verification on a CPU).

* :mod:`clover.kernels.linear`: ``nn.Linear`` layers for a handful of rows, per row
  count the kernel measured fastest on this machine (MKL's product in either layout, or
  oneDNN's pre-packed weights).
* :mod:`clover.kernels.attention`: grouped-query attention under SDPA without
  materialising the repeated KV heads.

Only :mod:`clover.models` installs them, behind one load-time switch
(``TargetModel(cpu_kernels=..., linear_layout=...)``; ``CLOVER_CPU_KERNELS=0`` turns them
off, ``CLOVER_CPU_KERNELS=few-row``, ``plain``, ``packed`` or a pair such as
``few-row/packed`` names the linear layout instead of timing them).
"""
