"""streamlab's Jupyter server extension: the backend of the lab's Streams side panel.

It serves ``<base_url>streamlab/api/`` (handlers.py): the clusters this server may see (the
embedded cluster of each of its kernels, and the standing clusters of ``StreamlabLab.cluster_dirs``)
read from each JobManager's REST API, so the page never holds a cluster's address or token.
Enabled by ``jupyter-config/streamlab_labext.json`` (``make setup`` puts it in the venv).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from traitlets import List, Unicode
from traitlets.config import LoggingConfigurable

from .clusters import ClusterList, KnownCluster, known_clusters


class StreamlabLab(LoggingConfigurable):
    """The lab extension's settings, and the server's view of its clusters."""

    cluster_dirs = List(Unicode(), help="Directories of standing clusters (streamlab cluster start --dir ...) "
                                        "the Streams panel shows besides the kernels' own.").tag(config=True)

    def __init__(self, serverapp, **kwargs):
        super().__init__(parent=serverapp, **kwargs)
        self.serverapp = serverapp
        self.cluster_list = ClusterList(self.known_clusters)

    async def known_clusters(self) -> dict[str, KnownCluster]:
        kernels = self.serverapp.kernel_manager
        return await known_clusters(list(self.cluster_dirs), Path(self.serverapp.runtime_dir),
                                    set(kernels.list_kernel_ids()), self._notebook_of)

    async def _notebook_of(self, kernel_id: str) -> Optional[str]:
        for session in await self.serverapp.session_manager.list_sessions():
            if (session.get("kernel") or {}).get("id") == kernel_id:
                return session.get("path")
        return None


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "streamlab_labext"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from .handlers import handlers
    lab = StreamlabLab(serverapp)
    web_app = serverapp.web_app
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"], lab))
    serverapp.log.info("streamlab: the Streams panel's API at %sstreamlab/api/ (standing clusters: %s)",
                       web_app.settings["base_url"], ", ".join(lab.cluster_dirs) or "none")
