"""wdiff's own import-linter contract type, registered in pyproject.toml
(``contract_types``) and checked by ``lint-imports`` with the others.

``acyclic_modules``: no two modules of the package import each other, by
any path, at module level or inside a function. import-linter's
``acyclic_siblings`` compares sibling packages and modules; a package's
``__init__`` and one of its own modules importing each other (as
``wdiff.bench`` and ``wdiff.bench.fanout`` once did) are not siblings, so it
passes them. This contract looks at every module.
"""

from __future__ import annotations

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def cycles(graph: grimp.ImportGraph, root: str) -> list[list[str]]:
    """The strongly connected components of more than one module under
    ``root`` (Tarjan's algorithm, iterative), each sorted, in order."""
    modules = sorted(m for m in graph.modules if m == root or m.startswith(root + "."))
    inside = set(modules)
    succ = {m: sorted(graph.find_modules_directly_imported_by(m) & inside) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in modules:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            if i < len(succ[node]):
                work.append((node, i + 1))
                nxt = succ[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work and work[-1][0] != node:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


class AcyclicModulesContract(Contract):
    type_name = "acyclic_modules"

    root = fields.StringField()

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        found = cycles(graph, str(self.root))
        return ContractCheck(kept=not found, metadata={"cycles": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for comp in check.metadata["cycles"]:
            output.print_error(f"These modules import each other: {', '.join(comp)}")
            output.new_line()
