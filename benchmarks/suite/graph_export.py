"""Message-passing graph networks in plain torch, as ONNX through both of torch's exporters, for `benchmarks.bench_graph`.

    <python with torch + onnx [+ onnxscript]> -m benchmarks.suite.graph_export [--out DIR] [--exporter ts dynamo]
        [--models gcn sage ...]

Runs in any Python that has torch and onnx (plus onnxscript for the dynamo exporter), not in quantsim's
environment: quantsim never imports torch. Nothing is downloaded and torch_geometric is not used: each network
is written the way users write message passing by hand (``scatter_add_`` / ``index_add_`` for degrees and sums,
``scatter_reduce`` with ``mean`` / ``amax`` for SAGE and softmax over incoming edges, ``index_select`` and
``gather`` of node features by edge index, ``topk`` on pairwise distances for EdgeConv, ``index_put_`` for a
scatter-assign), with weights from a fixed seed. Inputs: node features float32 ``[N, F]``, ``edge_index``
int64 ``[2, E]`` (and ``batch`` int64 ``[N]`` for the graph-level readout); shapes fixed at export, and a
``<model>_dyn`` variant with the node and edge counts dynamic (``dynamic_axes``), fed graphs of 32-96 nodes.

Files: ``DIR/<model>.<exporter>.onnx`` (``ts``: TorchScript, opset 17; ``dynamo``: torch.export, opset 18)
and ``DIR/<model>.feeds.npz``: input feeds with valid indices, arrays named ``<input>__<k>`` for feed ``k``
(the first six calibrate, the rest evaluate), and torch's own outputs as ``torch_output__<k>``. Input names
are the forward's argument names in both exporters.
Weights are random: use the files for op coverage, placement and export parity, not for accuracy.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.suite.exporting import export_each, torch_onnx_export

DEFAULT_OUT = Path.home() / ".cache" / "quantsim" / "models" / "graph"
NODES, FEATURES, GRAPHS, FEEDS = 64, 16, 4, 10
DYNAMIC_NODES = (64, 48, 80, 32, 96, 56, 72, 40, 88, 64)  # node counts of the dynamic variants' feeds
REFERENCE = "torch_output"  # the npz key prefix of torch's own outputs (to check the exporters)


def _graph_feeds(rng: np.random.Generator, sizes: list[int], batch: bool) -> list[dict[str, np.ndarray]]:
    """Random graphs of ``sizes`` nodes each: N(0, 1) node features, ``4 N`` edges between random nodes of the
    same graph segment (the first ``N`` of them self-loops, so every node has an incoming edge), and the batch
    vector splitting the nodes into ``GRAPHS`` contiguous graphs."""
    feeds = []
    for nodes in sizes:
        per = nodes // GRAPHS
        x = rng.standard_normal((nodes, FEATURES)).astype(np.float32)
        extra = 3 * nodes
        src = rng.integers(0, nodes, extra)
        dst = (src // per) * per + rng.integers(0, per, extra)  # the same graph as its source
        loops = np.arange(nodes)
        edge_index = np.stack([np.concatenate([loops, src]), np.concatenate([loops, dst])]).astype(np.int64)
        feed = {"x": x, "edge_index": edge_index}
        if batch:
            feed["batch"] = np.repeat(np.arange(GRAPHS), per).astype(np.int64)
        feeds.append(feed)
    return feeds


def _point_feeds(rng: np.random.Generator, sizes: list[int]) -> list[dict[str, np.ndarray]]:
    return [{"points": rng.standard_normal((nodes, 3)).astype(np.float32)} for nodes in sizes]


def _models():  # noqa: C901 - one class per network, read as a catalogue
    import torch
    from torch import nn

    def degree(index, n: int, dtype):
        return torch.zeros(n, dtype=dtype).scatter_add_(0, index, torch.ones_like(index, dtype=dtype))

    class GCN(nn.Module):
        """Two GCN layers: D^-1/2 A D^-1/2 X W, degrees by scatter_add_, sums by index_add_."""

        def __init__(self):
            super().__init__()
            self.lin1, self.lin2 = nn.Linear(FEATURES, 32), nn.Linear(32, 8)

        def conv(self, x, edge_index, lin):
            src, dst = edge_index[0], edge_index[1]
            deg = degree(dst, x.shape[0], x.dtype)
            norm = deg.pow(-0.5)
            weight = norm[src] * norm[dst]
            h = lin(x)
            messages = h.index_select(0, src) * weight.unsqueeze(-1)
            return torch.zeros_like(h).index_add_(0, dst, messages)

        def forward(self, x, edge_index):
            return self.conv(torch.relu(self.conv(x, edge_index, self.lin1)), edge_index, self.lin2)

    class SAGE(nn.Module):
        """GraphSAGE with mean aggregation by scatter_reduce(reduce="mean")."""

        def __init__(self):
            super().__init__()
            self.self1, self.neigh1 = nn.Linear(FEATURES, 32), nn.Linear(FEATURES, 32, bias=False)
            self.self2, self.neigh2 = nn.Linear(32, 8), nn.Linear(32, 8, bias=False)

        @staticmethod
        def mean(x, edge_index):
            src, dst = edge_index[0], edge_index[1]
            index = dst.unsqueeze(-1).expand(-1, x.shape[1])
            return torch.zeros_like(x).scatter_reduce(0, index, x[src], reduce="mean", include_self=False)

        def forward(self, x, edge_index):
            h = torch.relu(self.self1(x) + self.neigh1(self.mean(x, edge_index)))
            return self.self2(h) + self.neigh2(self.mean(h, edge_index))

    class SAGECount(nn.Module):
        """GraphSAGE with the mean written as index_add_ of messages over an index_add_ count."""

        def __init__(self):
            super().__init__()
            self.lin_self, self.lin_neigh = nn.Linear(FEATURES, 32), nn.Linear(FEATURES, 32)
            self.out = nn.Linear(32, 8)

        def forward(self, x, edge_index):
            src, dst = edge_index[0], edge_index[1]
            total = torch.zeros_like(x).index_add_(0, dst, x.index_select(0, src))
            count = torch.zeros(x.shape[0], dtype=x.dtype).index_add_(0, dst, torch.ones_like(dst, dtype=x.dtype))
            h = self.lin_self(x) + self.lin_neigh(total / count.clamp(min=1).unsqueeze(-1))
            return self.out(torch.relu(h))

    class GAT(nn.Module):
        """One multi-head GAT layer: per-edge attention logits, softmax over each node's incoming edges by
        scatter_reduce(amax) + exp + scatter_add, node features gathered by edge index."""

        heads, width = 4, 8

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(FEATURES, self.heads * self.width, bias=False)
            self.att_src = nn.Parameter(torch.randn(1, self.heads, self.width) * 0.3)
            self.att_dst = nn.Parameter(torch.randn(1, self.heads, self.width) * 0.3)
            self.out = nn.Linear(self.heads * self.width, 8)

        def forward(self, x, edge_index):
            src, dst = edge_index[0], edge_index[1]
            n = x.shape[0]
            h = self.lin(x).view(n, self.heads, self.width)
            a_src, a_dst = (h * self.att_src).sum(-1), (h * self.att_dst).sum(-1)  # [N, H]
            logits = nn.functional.leaky_relu(a_src.index_select(0, src) + a_dst.index_select(0, dst), 0.2)
            index = dst.unsqueeze(-1).expand(-1, self.heads)
            peak = torch.full((n, self.heads), -1e9).scatter_reduce(0, index, logits, reduce="amax",
                                                                    include_self=True)
            e = torch.exp(logits - torch.gather(peak, 0, index))
            total = torch.zeros(n, self.heads).scatter_add(0, index, e)
            alpha = e / torch.gather(total, 0, index)
            messages = h.index_select(0, src) * alpha.unsqueeze(-1)
            agg = torch.zeros_like(h).index_add_(0, dst, messages).reshape(n, -1)
            return self.out(nn.functional.elu(agg))

    class GIN(nn.Module):
        """Two GIN layers: (1 + eps) x + sum of neighbours (index_add_), then an MLP."""

        def __init__(self):
            super().__init__()
            self.mlp1 = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 32))
            self.mlp2 = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
            self.eps = nn.Parameter(torch.tensor(0.1))

        def layer(self, x, edge_index, mlp):
            agg = torch.zeros_like(x).index_add_(0, edge_index[1], x[edge_index[0]])
            return mlp((1 + self.eps) * x + agg)

        def forward(self, x, edge_index):
            return self.layer(torch.relu(self.layer(x, edge_index, self.mlp1)), edge_index, self.mlp2)

    class MPNN(nn.Module):
        """Edge-conditioned message passing: edge features (relative node features) through a Linear gate the
        messages, summed with scatter_add; a GRU-free update."""

        def __init__(self):
            super().__init__()
            self.edge = nn.Linear(FEATURES, 32)
            self.msg = nn.Linear(FEATURES, 32)
            self.update = nn.Linear(FEATURES + 32, 8)

        def forward(self, x, edge_index):
            src, dst = edge_index[0], edge_index[1]
            x_src, x_dst = x[src], x[dst]
            gate = torch.sigmoid(self.edge(x_src - x_dst))
            messages = self.msg(x_src) * gate
            index = dst.unsqueeze(-1).expand_as(messages)
            agg = torch.zeros(x.shape[0], 32).scatter_add(0, index, messages)
            return self.update(torch.cat([x, agg], dim=-1))

    class Readout(nn.Module):
        """GCN-style layer then per-graph mean and max pooling through the batch vector, and a classifier."""

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(FEATURES, 32)
            self.head = nn.Linear(64, 5)

        def forward(self, x, edge_index, batch):
            src, dst = edge_index[0], edge_index[1]
            h = self.lin(x)
            h = torch.relu(torch.zeros_like(h).index_add_(0, dst, h[src]))
            index = batch.unsqueeze(-1).expand_as(h)
            count = degree(batch, GRAPHS, h.dtype).clamp(min=1).unsqueeze(-1)
            mean = torch.zeros(GRAPHS, h.shape[1]).scatter_add(0, index, h) / count
            peak = torch.zeros(GRAPHS, h.shape[1]).scatter_reduce(0, index, h, reduce="amax", include_self=False)
            return self.head(torch.cat([mean, peak], dim=-1))

    class EdgeConv(nn.Module):
        """DGCNN EdgeConv on a point cloud: kNN by topk of negative pairwise distances, neighbours by gather,
        an MLP on [x_i, x_j - x_i], max over the k neighbours; then a global max."""

        k = 8

        def __init__(self):
            super().__init__()
            self.mlp1 = nn.Sequential(nn.Linear(6, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32))
            self.mlp2 = nn.Sequential(nn.Linear(64, 32), nn.LeakyReLU(0.2))
            self.head = nn.Linear(32, 10)

        def edge_conv(self, x, mlp):
            inner = x @ x.transpose(0, 1)
            square = (x * x).sum(-1, keepdim=True)
            neg_dist = 2 * inner - square - square.transpose(0, 1)
            idx = neg_dist.topk(self.k, dim=-1).indices  # [N, k]
            n, f = x.shape
            neighbours = torch.gather(x.unsqueeze(0).expand(n, n, f), 1, idx.unsqueeze(-1).expand(n, self.k, f))
            centre = x.unsqueeze(1).expand(n, self.k, f)
            return mlp(torch.cat([centre, neighbours - centre], dim=-1)).amax(dim=1)

        def forward(self, points):
            h = self.edge_conv(points, self.mlp1)
            h = self.edge_conv(h, self.mlp2)
            return self.head(h.amax(dim=0, keepdim=True))

    class ScatterAssign(nn.Module):
        """Scatter-assign written with Tensor.scatter_ and index_put_: each node's last incoming message
        (scatter_ with one source per destination: the self-loops) and a learned embedding written into the
        rows of the first node of each graph segment."""

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(FEATURES, 16)
            self.token = nn.Parameter(torch.randn(16))
            self.out = nn.Linear(32, 8)

        def forward(self, x, edge_index):
            h = self.lin(x)
            n = x.shape[0]
            loops = edge_index[:, :n]  # the self-loop edges: dst is a permutation, writes do not collide
            written = torch.zeros_like(h).scatter_(0, loops[1].unsqueeze(-1).expand(-1, 16), h[loops[0]])
            rows = torch.arange(0, n, n // GRAPHS)
            marked = h.clone()
            marked.index_put_((rows,), self.token.expand(rows.shape[0], 16))
            return self.out(torch.relu(torch.cat([written, marked], dim=-1)))

    class MolGINE(nn.Module):
        """A molecular GINE (OGB style): atom and bond types through embedding tables, messages
        relu(x_src + bond) summed by index_add_, an MLP, then a global sum pool per molecule (index_add_ by the
        batch vector) and a classifier."""

        atoms, bonds = 10, 4

        def __init__(self):
            super().__init__()
            self.atom = nn.Embedding(self.atoms, 32)
            self.bond = nn.Embedding(self.bonds, 32)
            self.mlp = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
            self.head = nn.Linear(32, 2)

        def forward(self, atom_type, edge_index, bond_type, batch):
            h = self.atom(atom_type)
            src, dst = edge_index[0], edge_index[1]
            messages = torch.relu(h[src] + self.bond(bond_type))
            h = torch.relu(self.mlp(h + torch.zeros_like(h).index_add_(0, dst, messages)))
            pooled = torch.zeros(GRAPHS, h.shape[1]).index_add_(0, batch, h)
            return self.head(pooled)

    class DenseGAT(nn.Module):
        """GAT on a dense 0/1 adjacency input, as small-graph code writes it: attention logits masked by
        ``masked_fill(adj == 0, -inf)``, a Softmax over each row, the features aggregated by a matmul."""

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(FEATURES, 32, bias=False)
            self.a_src, self.a_dst = nn.Linear(32, 1, bias=False), nn.Linear(32, 1, bias=False)
            self.out = nn.Linear(32, 8)

        def forward(self, x, adj):
            h = self.lin(x)
            e = nn.functional.leaky_relu(self.a_src(h) + self.a_dst(h).transpose(0, 1), 0.2)
            alpha = torch.softmax(e.masked_fill(adj == 0, float("-inf")), dim=-1)
            return self.out(torch.relu(alpha @ h))

    return {"gcn": GCN, "sage_mean": SAGE, "sage_count": SAGECount, "gat": GAT, "gin": GIN, "mpnn": MPNN,
            "readout": Readout, "edgeconv": EdgeConv, "scatter_assign": ScatterAssign, "mol_gine": MolGINE,
            "dense_gat": DenseGAT}


NAMES = ("gcn", "sage_mean", "sage_count", "gat", "gin", "mpnn", "readout", "edgeconv", "scatter_assign", "mol_gine",
         "dense_gat")


def feeds(name: str, dynamic: bool = False) -> list[dict[str, np.ndarray]]:
    """The input feeds of model ``name`` (seeded by its name): ``NODES`` nodes each, or with ``dynamic``
    the node counts of `DYNAMIC_NODES`."""
    rng = np.random.default_rng(sum(map(ord, name)))
    sizes = list(DYNAMIC_NODES) if dynamic else [NODES] * FEEDS
    if name == "edgeconv":
        return _point_feeds(rng, sizes)
    if name == "dense_gat":  # the edges as a dense adjacency with self-loops
        graphs = _graph_feeds(rng, sizes, batch=False)
        for feed in graphs:
            n = feed["x"].shape[0]
            adj = np.zeros((n, n), np.float32)
            adj[feed.pop("edge_index")[::-1].tolist()] = 1.0  # adj[dst, src]
            feed["adj"] = adj
        return graphs
    graphs = _graph_feeds(rng, sizes, batch=name in ("readout", "mol_gine"))
    if name == "mol_gine":  # atom and bond types in place of features
        for feed in graphs:
            feed["atom_type"] = rng.integers(0, 10, feed["x"].shape[0]).astype(np.int64)
            feed["bond_type"] = rng.integers(0, 4, feed["edge_index"].shape[1]).astype(np.int64)
        graphs = [{key: feed[key] for key in ("atom_type", "edge_index", "bond_type", "batch")} for feed in graphs]
    return graphs


def _dynamic_axes(inputs: dict[str, np.ndarray]) -> dict[str, dict[int, str]]:
    """The node and edge dimensions of each input, by name."""
    return {key: {1: "edges"} if key == "edge_index" else {0: "edges"} if key == "bond_type"
            else {0: "nodes", 1: "nodes"} if key == "adj" else {0: "nodes"} for key in inputs}


def export(name: str, exporter: str, out: Path, dynamic: bool = False) -> Path:
    """``DIR/<name>[_dyn].<exporter>.onnx`` and its feeds (``_dyn``: node and edge counts dynamic)."""
    import torch

    torch.manual_seed(0)
    model = _models()[name]().eval()
    inputs = feeds(name, dynamic)
    stem = f"{name}_dyn" if dynamic else name
    with torch.no_grad():
        outputs = [model(*(torch.from_numpy(v) for v in feed.values())).numpy() for feed in inputs]
    np.savez(out / f"{stem}.feeds.npz", **{f"{key}__{k}": value for k, feed in enumerate(inputs)
                                           for key, value in feed.items()},
             **{f"{REFERENCE}__{k}": value for k, value in enumerate(outputs)})
    args = tuple(torch.from_numpy(value) for value in inputs[0].values())
    names = list(inputs[0])
    target = out / f"{stem}.{exporter}.onnx"
    axes = _dynamic_axes(inputs[0]) if dynamic else None
    return torch_onnx_export(model, args, target, exporter, names, ["output"], axes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--exporter", nargs="+", choices=("ts", "dynamo"), default=["ts", "dynamo"])
    parser.add_argument("--models", nargs="+", choices=NAMES, default=list(NAMES))
    parser.add_argument("--no-dynamic", action="store_true", help="skip the variants with dynamic node/edge counts")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = (False,) if args.no_dynamic else (False, True)
    export_each((f"{name}{'_dyn' if dynamic else ''} ({exporter})",
                 lambda name=name, exporter=exporter, dynamic=dynamic: export(name, exporter, out, dynamic))
                for dynamic in variants for exporter in args.exporter for name in args.models)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
