//! The cluster the bench builds in this process: its nodes, each on its own runtime and
//! data directory under the bench's temporary directory, driven through their handles, and
//! restarted on the same directory after a kill. (`processes.rs` builds it from node processes.)

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use piecework_node::{Config, IsolatedNode, Multiaddr, NodeHandle, spawn_isolated};
use piecework_queue_doc::{Claim, PeerId, QueueId, QueueView};
use tokio::sync::watch;

use super::{Options, wait_view};

/// The nodes, by index; a killed node's slot is empty until it is restarted.
pub(super) struct Cluster {
    pub(super) root: PathBuf,
    pub(super) workers: u32,
    pub(super) rotate_min_live: Option<usize>,
    pub(super) archive_keep: u64,
    pub(super) max_live: Option<usize>,
    pub(super) nodes: Vec<Option<IsolatedNode>>,
    pub(super) peers: Vec<PeerId>,
    pub(super) queue: QueueId,
}

impl Cluster {
    pub(super) fn config(
        root: &Path,
        workers: u32,
        rotate_min_live: Option<usize>,
        archive_keep: u64,
        max_live: Option<usize>,
        i: usize,
        bootstrap: Vec<Multiaddr>,
    ) -> Config {
        let mut c = Config::new(root.join(format!("node{i}")), crate::kinds::builtin());
        c.archive_keep = archive_keep;
        c.workers = workers;
        c.bootstrap = bootstrap;
        c.rotation = rotate_min_live.map(|m| (piecework_node::ROTATE_RATIO, m));
        c.max_live = max_live;
        c
    }

    pub(super) async fn start(opts: &Options, root: &Path) -> anyhow::Result<Cluster> {
        let first = spawn_isolated(
            Cluster::config(
                root,
                opts.workers,
                opts.rotate_min_live,
                opts.archive_keep(),
                opts.node_max_live(),
                0,
                vec![],
            ),
            1,
        )
        .await
        .context("cannot start node 0")?;
        let addr = first.handle().wait_listening().await;
        let mut nodes = vec![Some(first)];
        for i in 1..opts.nodes {
            let n = spawn_isolated(
                Cluster::config(
                    root,
                    opts.workers,
                    opts.rotate_min_live,
                    opts.archive_keep(),
                    opts.node_max_live(),
                    i,
                    vec![addr.clone()],
                ),
                1,
            )
            .await
            .with_context(|| format!("cannot start node {i}"))?;
            nodes.push(Some(n));
        }
        let peers: Vec<PeerId> = nodes
            .iter()
            .flatten()
            .map(|n| n.handle().peer_id().clone())
            .collect();
        let h0 = nodes[0].as_ref().expect("started").handle().clone();
        let queue = h0
            .create_queue("bench", Some(opts.timings.config()))
            .await
            .context("cannot create the queue")?;
        for (i, n) in nodes.iter().enumerate().skip(1) {
            let h = n.as_ref().expect("started").handle();
            h.join_from(&h0, &queue, crate::queue_doc::Role::Member)
                .await
                .with_context(|| format!("node {i} cannot join the queue"))?;
        }
        let cluster = Cluster {
            root: root.to_owned(),
            workers: opts.workers,
            rotate_min_live: opts.rotate_min_live,
            archive_keep: opts.archive_keep(),
            max_live: opts.node_max_live(),
            nodes,
            peers,
            queue,
        };
        for i in 0..opts.nodes {
            cluster.router(i).await?;
        }
        Ok(cluster)
    }

    pub(super) fn handle(&self, i: usize) -> anyhow::Result<NodeHandle> {
        self.nodes[i]
            .as_ref()
            .map(|n| n.handle().clone())
            .with_context(|| format!("node {i} is not running"))
    }

    pub(super) fn handles(&self) -> Vec<NodeHandle> {
        self.nodes
            .iter()
            .flatten()
            .map(|n| n.handle().clone())
            .collect()
    }

    pub(super) fn watch(&self, i: usize) -> anyhow::Result<watch::Receiver<Arc<QueueView>>> {
        self.handle(i)?
            .watch_queue(&self.queue)
            .with_context(|| format!("node {i} has not opened the queue"))
    }

    /// The router as node `i` sees it, once it sees one.
    async fn router(&self, i: usize) -> anyhow::Result<Claim> {
        let mut rx = self.watch(i)?;
        wait_view(&mut rx, Duration::from_secs(60), "a router", |v| {
            v.router.clone()
        })
        .await
    }
}
