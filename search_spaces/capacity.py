"""CUDA GPUs, large batches (capacity regime): the GPU space plus batch streaming, so a
profile with little memory can still run the case in bounded chunks."""

from search_spaces.gpu import SPACE as _GPU

SPACE = dict(
    _GPU,
    name="gpu-capacity",
    regimes=["capacity"],
    priority=10,
    params=[*_GPU["params"], {"name": "batch_chunk", "values": [0, 1250, 2500, 5000]}],
)
