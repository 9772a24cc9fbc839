"""``import attnhub.ipu.auto`` routes ``torch.nn.functional.scaled_dot_product_attention`` through attnhub.

As ``import flash_attention_ipu.auto`` did: importing this module patches SDPA (see
:func:`attnhub.torch.patch_sdpa`). Inside a PopTorch model the ``ipu`` backend serves the calls;
elsewhere attnhub's dispatch picks the best backend; what attnhub cannot serve goes to torch.
:func:`attnhub.torch.unpatch_sdpa` undoes it.
"""

from __future__ import annotations

from attnhub.torch import patch_sdpa

patch_sdpa()
