"""verify's rule 4, depth: no Reserve, Push, Wait or Pop moves more pages than its ring holds (it could never
complete)."""

from __future__ import annotations

from ...errors import RingDepthError
from ...ir.ids import Site
from ...ir.index import ProgramIndex, where
from .facts import SiteProgs


def check_depths(ctx: ProgramIndex, site: Site, progs: SiteProgs) -> None:
    """Rule 4: no Reserve, Push, Wait or Pop moves more pages than its ring holds."""
    for prog, facts in progs:
        for use in facts.uses:
            depth = ctx.depth(ctx.ring(use.buf))
            if use.flow > depth:
                text, engine = ctx.op(use.op), prog.engine.value
                raise RingDepthError(
                    f"{where(site, engine)}: {text} — moves {use.flow} pages of {ctx.name(use.buf)},"
                    f" a ring of {depth}; it could never complete",
                    site=int(site),
                    engine=engine,
                    op=text,
                    buffer=ctx.name(use.buf),
                )
