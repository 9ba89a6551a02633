//! Wire types of the interface (docs/design.md §2, `docs/openapi.json`), shared by the
//! server and the HTTP client, plus the helpers both sides need: paths, ranges, times, and a
//! [`Secret`] type that keeps tokens out of logs.

pub mod changes;
pub mod checksum;
pub mod envelope;
pub mod error;
pub mod files;
pub mod path;
pub mod range;
pub mod search;
pub mod secret;
pub mod time;
pub mod types;
pub mod usage;

pub use self::time::{format_time, parse_time};
pub use changes::{Change, ChangeKind, ChangesPage};
pub use envelope::{Envelope, ErrorObject};
pub use error::{Error, ErrorKind, Result};
pub use path::NodePath;
pub use range::RangeRequest;
pub use search::{SearchHit, SearchResults};
pub use secret::Secret;
pub use types::*;
pub use usage::Usage;
