"""Check the post-LN claim behind ``remove_norm_directions`` on the real all-MiniLM-L6-v2.

For the pretrained model and its random-init twin (``demo.random_like``, seed 0), last token of
the demo's four general prompts, float64 dense Jacobians from autograd on each block (no
blockcoupling engine code, an independent check): prints ``max |N^T J + N^T|`` (the rows of
``J_tt`` in the LayerNorm's directions are minus the identity), the top singular values with and
without the projection, the share of the top-2 left singular subspace inside ``N``, and the mean
depth-wise ``coupling`` / ``coupling_vs_null`` at K = 10 over layer pairs l != l'.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 python tools/verify_norm_directions.py [pretrained] [random]

Numbers measured with it are in docs/conventions.md ("Post-LN blocks").
"""

from __future__ import annotations

import sys

import torch

from blockcoupling.engine import metrics, normdirs
from blockcoupling.studies.demo import demo_prompts, load_minilm, random_like

K = 10


def block_jacobians(model: torch.nn.Module, tok: object, text: str
                    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """J^l_tt (float64, last token) and N_t of every block."""
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        hs = model(**enc, output_hidden_states=True).hidden_states
    t = enc["input_ids"].shape[1] - 1
    Js, Ns = [], []
    for layer, block in enumerate(model.encoder.layer, start=1):
        block = block.double()
        x = hs[layer - 1][0].double()

        def out(h: torch.Tensor, block: torch.nn.Module = block) -> torch.Tensor:
            o = block(h.unsqueeze(0))
            return (o[0] if isinstance(o, tuple) else o)[0]

        def g(v: torch.Tensor, x: torch.Tensor = x, out=out) -> torch.Tensor:  # noqa: ANN001
            h = x.clone()
            h[t] = v
            return (out(h) - h)[t]

        J = torch.autograd.functional.jacobian(g, x[t].clone(), vectorize=True)
        with torch.no_grad():
            y = out(x)[t]
        ln = block.output.LayerNorm
        Ns.append(normdirs.layernorm_null_basis(y, ln.weight.detach(), ln.bias.detach()))
        Js.append(J)
        block.float()
    return Js, Ns


def depth_means(Js: list[torch.Tensor]) -> tuple[float, float]:
    d = Js[0].shape[0]
    svds = [torch.linalg.svd(J) for J in Js]
    c, v = [], []
    for a, Ja in enumerate(Js):
        for b, (U, _, Vh) in enumerate(svds):
            if a == b:
                continue
            A = U[:, :K].T @ Ja @ Vh[:K].T
            s1 = svds[a][1]
            c.append(float(metrics.coupling_values(A, s1, K, "coupling", 1)))
            v.append(float(metrics.coupling_values(A, s1, K, "coupling_vs_null", 1,
                                                   fro2=(Ja ** 2).sum(), d=d)))
    return sum(c) / len(c), sum(v) / len(v)


def main() -> None:
    which = sys.argv[1:] or ["pretrained", "random"]
    pretrained, tok = load_minilm()
    models = {"pretrained": pretrained, "random": random_like(pretrained, seed=0)}
    for name in which:
        rows = {"as defined": [], "directions removed": []}
        for i, text in enumerate(demo_prompts("general")):
            Js, Ns = block_jacobians(models[name], tok, text)
            Jp = [normdirs.project_rows(J, N) for J, N in zip(Js, Ns, strict=True)]
            if i == 0:
                err = max(float((N.T @ J + N.T).abs().max()) for J, N in zip(Js, Ns, strict=True))
                U = torch.linalg.svd(Js[0])[0][:, :2]
                share = float(torch.linalg.matrix_norm(Ns[0].T @ U) ** 2 / 2)
                print(f"{name}: max |N^T J + N^T| = {err:.2e}; top-2 left subspace in N: {share:.3f}")
                for tag, JJ in (("as defined", Js), ("directions removed", Jp)):
                    top = [[round(float(s), 3) for s in torch.linalg.svdvals(J)[:4]] for J in JJ]
                    print(f"  top singular values per layer, {tag}: {top}")
            rows["as defined"].append(depth_means(Js))
            rows["directions removed"].append(depth_means(Jp))
        for tag, vals in rows.items():
            c = sum(r[0] for r in vals) / len(vals)
            v = sum(r[1] for r in vals) / len(vals)
            print(f"{name}, {tag}: coupling {c:.3f}, coupling_vs_null {v:.3f}")


if __name__ == "__main__":
    main()
