//! The node's state by concern, one sub-machine per module: the documents being loaded,
//! waited for and evicted (`Documents`), the peers (`Members`), the submits waiting for their
//! acknowledgement (`Submits`), status requests and members' questions (`Lookups`), archived
//! statuses (`Archive`), the ends of tasks seen ending lately (`Ends`), runs and the writes they make (`Runs`), and the epoch documents and
//! the epoch work in flight (`Epochs`). Each keeps its fields to itself, bounded as they say,
//! and owns the bookkeeping decisions about them: the turn modules tell it what happened and
//! ask it what follows. None asks another: they meet in `Core`'s methods, which pass each what
//! it needs. Imports nothing of the node but the other state modules (`waiters`, `writes`,
//! `evict`, `queue_state`).

mod archive;
mod documents;
mod ends;
mod epochs;
mod lookups;
mod members;
mod runs;
mod submits;

pub(super) use archive::Archive;
pub(super) use documents::Documents;
pub(super) use ends::Ends;
pub(super) use epochs::Epochs;
pub(super) use lookups::{EndWait, Lookups, PeerLookup};
pub(super) use members::Members;
pub(super) use runs::Runs;
pub(super) use submits::Submits;
