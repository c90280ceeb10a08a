"""Re-statement of textbook self-attention / multi-head attention classes (user's seed 003).

Why a re-statement: the classes are printed in lecture notes; no package ships them.

Published source: the notes quoted in seed 003 (sword4869 attention notes, sections 2.1 and
3.1; the multi-head code is stated there to match
datnnt1997/multi-head_self-attention ``selfattention.py``). Block ids:

* ``textbook.SelfAttention``      <- ``Self_Attention(Dx, D, Dv)``
* ``textbook.MultiHeadAttention`` <- ``MultiHead_Attention(input_dim, nh, dh)`` (first form, "head
  count and head dim") and ``MultiHead_Attention_DAll(input_dim, d_all, nh)`` (second form, "total
  dim and head count"; published under the same name ``MultiHead_Attention``).

Semantics kept exactly: all projections are biased ``nn.Linear``; scores are DIVIDED by
``D ** 0.5`` / ``dh ** 0.5`` / ``(d_all / nh) ** 0.5`` after the matmul; heads split as
``'b nq (nh dh) -> b nh nq dh'``; no norm and no residual; the multi-head output has
``nh * dh`` (resp. ``d_all``) features, not ``input_dim``.
"""

import torch
from torch import nn
from einops import rearrange


class Self_Attention(nn.Module):
    def __init__(self, Dx, D, Dv):
        super().__init__()
        self.q = nn.Linear(Dx, D)
        self.k = nn.Linear(Dx, D)
        self.v = nn.Linear(Dx, Dv)
        self.scale = D ** 0.5

    def forward(self, x):
        # x: [b, N, Dx]
        Q = self.q(x)  # [b, N, D]
        K = self.k(x)  # [b, N, D]
        V = self.v(x)  # [b, N, Dv]

        # [b, N, N]
        attn = (Q @ K.transpose(-2, -1)) / self.scale
        attn = attn.softmax(dim=-1)

        # [b, N, Dv]
        output = attn @ V
        return output


class MultiHead_Attention(nn.Module):
    """First published form: given the number of heads and the head dim."""

    def __init__(self, input_dim, nh, dh):
        super().__init__()
        self.q = nn.Linear(input_dim, nh * dh)
        self.k = nn.Linear(input_dim, nh * dh)
        self.v = nn.Linear(input_dim, nh * dh)
        self.fc = nn.Linear(nh * dh, nh * dh)
        self.nh = nh
        self.dh = dh
        self.scale = dh ** 0.5

    def forward(self, x):
        Q = self.q(x)
        K = self.k(x)
        V = self.v(x)

        Q = rearrange(Q, 'b nq (nh dh) -> b nh nq dh', nh=self.nh)
        K = rearrange(K, 'b nq (nh dh) -> b nh nq dh', nh=self.nh)
        V = rearrange(V, 'b nq (nh dh) -> b nh nq dh', nh=self.nh)

        # [b, nh, nq, nq]
        attn = (Q @ K.transpose(-2, -1)) / self.scale
        attn = attn.softmax(dim=-1)

        # [b, nh, nq, dh]
        output = attn @ V

        output = rearrange(output, 'b nh nq dh -> b nq (nh dh)')
        output = self.fc(output)
        return output


class MultiHead_Attention_DAll(nn.Module):
    """Second published form (also named ``MultiHead_Attention`` there): given the total dim and
    the number of heads."""

    def __init__(self, input_dim, d_all, nh):
        super().__init__()
        self.q = nn.Linear(input_dim, d_all)
        self.k = nn.Linear(input_dim, d_all)
        self.v = nn.Linear(input_dim, d_all)
        self.fc = nn.Linear(d_all, d_all)
        self.nh = nh
        self.d_all = d_all
        self.scale = (d_all / nh) ** 0.5

    def forward(self, x):
        Q = self.q(x)
        K = self.k(x)
        V = self.v(x)

        Q = rearrange(Q, 'b nq (nh dh) -> b nh nq dh', nh=self.nh)
        K = rearrange(K, 'b nq (nh dh) -> b nh nq dh', nh=self.nh)
        V = rearrange(V, 'b nq (nh dh) -> b nh nq dh', nh=self.nh)

        # [b, nh, nq, nq]
        attn = (Q @ K.transpose(-2, -1)) / self.scale
        attn = attn.softmax(dim=-1)

        # [b, nh, nq, dh]
        output = attn @ V

        output = rearrange(output, 'b nh nq dh -> b nq (nh dh)')
        output = self.fc(output)
        return output
