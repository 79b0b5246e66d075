"""Muon with AdamW for the other parameters, in fp64 NumPy, written from the published algorithm
(Keller Jordan, "Muon: An optimizer for hidden layers in neural networks", 2024, and its muon.py;
Liu et al., "Muon is Scalable for LLM Training" (Moonlight), arXiv 2502.16982, whose update scale
0.2 sqrt(max(A, B)) lets Muon's matrices share AdamW's learning rate), independently of
meshtrain's C++: the tests hold meshtrain to this, so it shares none of meshtrain's code.

Which parameters Muon steps is decided here from the names and shapes alone, by the rule the
papers state: the 2-D weight matrices of the hidden layers (inside a block, "h.<i>."), each
slice of a 3-D stacked tensor (E, rows, cols) on its own (a mixture's experts; the query, key and
value of a fused attention projection (3, C, C), as Llama's separate q, k and v); AdamW for the embeddings, the output
head, every 1-D parameter (norms, biases) and a mixture's router (a classifier, not a hidden
layer). AdamW (Loshchilov & Hutter, arXiv 1711.05101) decays the weights of two or more
dimensions, not the biases and norms (GPT-2's fused qkv bias is stored (3, C), still a bias).

Entry points:
    newton_schulz(G, steps, coefficients)     -> the orthogonalised G
    takes_muon(name, shape)                   -> whether Muon steps the parameter
    Optimizer(shapes, settings).step(values, grads, lr) -> the new values (dict by name)
"""

import math

import numpy as np

QUINTIC = (3.4445, -4.7750, 2.0315)


def newton_schulz(G, steps=5, coefficients=QUINTIC):
    """X <- a X + b (X X^T) X + c (X X^T)^2 X on G / (||G||_F + 1e-7), on the transpose of a tall
    G (the Gram matrix of the shorter side), transposed back."""
    a, b, c = coefficients
    X = np.asarray(G, dtype=np.float64) / (np.linalg.norm(G) + 1e-7)
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    return X.T if tall else X


def takes_muon(name, shape):
    hidden = name.startswith("h.") and name.endswith(".weight")
    return hidden and len(shape) in (2, 3) and ".router." not in name


class Optimizer:
    """One state per parameter: Muon's momentum matrix, or AdamW's two moments."""

    def __init__(self, shapes, weight_decay=0.1, momentum=0.95, nesterov=True, ns_steps=5,
                 coefficients=QUINTIC, rms_scale=0.2, beta1=0.9, beta2=0.95, eps=1e-8):
        self.shapes = dict(shapes)
        self.wd, self.mu, self.nesterov, self.ns_steps = weight_decay, momentum, nesterov, ns_steps
        self.coefficients, self.rms_scale = coefficients, rms_scale
        self.b1, self.b2, self.eps = beta1, beta2, eps
        self.t = 0
        self.state = {n: [np.zeros(s)] if takes_muon(n, s) else [np.zeros(s), np.zeros(s)]
                      for n, s in self.shapes.items()}

    def muon_matrix(self, W, G, M, lr):
        """Moonlight's step of one matrix, in place."""
        M *= self.mu
        M += G
        U = G + self.mu * M if self.nesterov else M
        O = newton_schulz(U, self.ns_steps, self.coefficients)
        W *= 1 - lr * self.wd
        W -= lr * self.rms_scale * math.sqrt(max(W.shape)) * O

    def adamw(self, W, G, m, v, lr, decay):
        m *= self.b1
        m += (1 - self.b1) * G
        v *= self.b2
        v += (1 - self.b2) * G * G
        m_hat = m / (1 - self.b1 ** self.t)
        v_hat = v / (1 - self.b2 ** self.t)
        if decay:
            W *= 1 - lr * self.wd
        W -= lr * m_hat / (np.sqrt(v_hat) + self.eps)

    def step(self, values, grads, lr):
        self.t += 1
        out = {}
        for name, shape in self.shapes.items():
            W = np.array(values[name], dtype=np.float64).reshape(shape)
            G = np.asarray(grads[name], dtype=np.float64).reshape(shape)
            s = self.state[name]
            if not takes_muon(name, shape):
                decay = len(shape) >= 2 and not name.endswith(".bias")
                self.adamw(W, G, s[0], s[1], lr, decay)
            elif len(shape) == 2:
                self.muon_matrix(W, G, s[0], lr)
            else:
                for e in range(shape[0]):
                    self.muon_matrix(W[e], G[e], s[0][e], lr)
            out[name] = W
        return out
