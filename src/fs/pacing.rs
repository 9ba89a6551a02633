//! Uploads shaped for latency (file-by-file uploads to a remote backend). Behind a link of
//! 50 ms, a small file's three steps one after the other cost more than its bytes, so:
//!
//! - Step 1 of the new files of a folder goes in one `create_file` request (the interface takes
//!   an array of names): the first waiting file goes at once, the ones that queued meanwhile
//!   go together in the next request (group commit: no timer, nothing waits for company).
//! - Steps 2 and 3 of many files are in flight at once, in a window that grows by one for each
//!   upload done while others wait for a place (doubling each round, as TCP's slow start) and
//!   halves when the server says it is busy (503, 429) or the link fails: at most once a second,
//!   so one burst of refusals is one cut. The retry of the failed file itself is `staging::retry`.
//!   Bounded by [`MAX_WINDOW`]: each upload streams its bytes from its staging file, so one in
//!   flight holds a descriptor and a buffer, not the file.
//! - The window follows the delay of step 2 (a small request whatever the file's size), as TCP
//!   Vegas does: it grows only while step 2 answers within twice the quickest answer seen, and
//!   gives back one place a round trip while it takes more than four times that. More uploads in
//!   flight then no longer store faster, they only queue at the server, where the user's own
//!   `mkdir` or `mv` waits behind them: on loopback the window grew to 64 and an untar's
//!   `mkdir`s waited 20 ms each. Behind a link of 50 ms the quickest answer is the round trip
//!   itself, and the window grows as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, SemaphorePermit, oneshot};

use super::Fs;
use super::table::Ino;
use crate::api::{Error, ErrorKind, Node, NodePath, Result};
use crate::backend::Backend;
use crate::sync::relock;

/// The most uploads in flight at once.
pub const MAX_WINDOW: usize = 64;
/// Names in one `create_file` request, and their bytes (the server takes 64 KiB of JSON).
const MAX_BATCH: usize = 100;
const MAX_BATCH_BYTES: usize = 32 << 10;
/// The window is cut at most this often.
const CUT_EVERY: Duration = Duration::from_secs(1);
/// The least the window gives back to for delay (a refusal can cut it further).
const MIN_WINDOW: usize = 4;
/// Added to the delay bounds: the scheduling noise of a quick server on loopback.
const GRACE: Duration = Duration::from_millis(2);
/// The quickest answer of step 2 is forgotten after this (the link may have changed).
const BASE_FOR: Duration = Duration::from_secs(30);

/// The uploads' shared state: the window and the folders whose new files are being created.
pub struct Pacing {
    pub window: Window,
    creating: Mutex<HashMap<NodePath, Vec<Waiter>>>,
}

type Waiter = (String, oneshot::Sender<Result<Node>>);

impl Pacing {
    /// A window starting at `start` uploads in flight.
    pub fn new(start: usize) -> Pacing {
        Pacing {
            window: Window::new(start),
            creating: Mutex::new(HashMap::new()),
        }
    }
}

/// How many uploads may be in flight: a semaphore's permits (waiters served in turn), which
/// grow by adding one and shrink by forgetting permits as they come back.
pub struct Window {
    permits: Semaphore,
    state: Mutex<WindowState>,
}

struct WindowState {
    limit: usize,
    /// Permits still to forget as uploads end (a cut beyond those free at the time).
    debt: usize,
    waiting: usize,
    cut_at: Option<Instant>,
    /// The quickest answer of step 2 seen, and when.
    base: Option<(Duration, Instant)>,
    /// The last answer of step 2 was within twice the quickest: the window may grow.
    quick: bool,
    /// When the window last gave back a place for delay.
    eased_at: Option<Instant>,
}

/// A place in the window, given back when dropped (or forgotten, after a cut).
pub struct Slot<'a> {
    window: &'a Window,
    permit: Option<SemaphorePermit<'a>>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut s = relock(&self.window.state);
        if s.debt > 0 {
            s.debt -= 1;
            if let Some(p) = self.permit.take() {
                p.forget();
            }
        }
    }
}

/// Counts a task waiting for a place while it waits (also when its wait is dropped).
struct Waiting<'a>(&'a Window);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        relock(&self.0.state).waiting -= 1;
    }
}

impl Window {
    fn new(start: usize) -> Window {
        let limit = start.clamp(1, MAX_WINDOW);
        Window {
            permits: Semaphore::new(limit),
            state: Mutex::new(WindowState {
                limit,
                debt: 0,
                waiting: 0,
                cut_at: None,
                base: None,
                quick: true,
                eased_at: None,
            }),
        }
    }

    /// Waits for a place in the window.
    pub async fn acquire(&self) -> Slot<'_> {
        relock(&self.state).waiting += 1;
        let waiting = Waiting(self);
        let permit = self.permits.acquire().await.expect("never closed");
        drop(waiting);
        Slot {
            window: self,
            permit: Some(permit),
        }
    }

    /// An upload went through: one more place if others waited for one and the server
    /// answers quickly (see the module's note).
    pub fn succeeded(&self) {
        let mut s = relock(&self.state);
        if s.waiting > 0 && s.limit < MAX_WINDOW && s.quick {
            s.limit += 1;
            if s.debt > 0 {
                s.debt -= 1;
            } else {
                self.permits.add_permits(1);
            }
        }
    }

    /// Step 2 of an upload was answered in `took`: the server's queue, as its delay shows.
    pub fn answered(&self, took: Duration) {
        let mut s = relock(&self.state);
        let base = match s.base {
            Some((b, at)) if b <= took && at.elapsed() < BASE_FOR => b,
            _ => {
                s.base = Some((took, Instant::now()));
                took
            }
        };
        s.quick = took <= base * 2 + GRACE;
        let queued = took > base * 4 + GRACE;
        // One place a round trip, as the uploads in flight see the last one given back.
        if queued && s.limit > MIN_WINDOW && s.eased_at.is_none_or(|t| t.elapsed() >= took) {
            s.eased_at = Some(Instant::now());
            let to = s.limit - 1;
            self.shrink(&mut s, to);
        }
    }

    /// An upload failed: a server at its limits or a failing link halves the window.
    pub fn failed(&self, e: &Error) {
        if !matches!(
            e.kind,
            ErrorKind::Unavailable | ErrorKind::TooManyRequests | ErrorKind::Network
        ) {
            return;
        }
        let mut s = relock(&self.state);
        if s.cut_at.is_some_and(|t| t.elapsed() < CUT_EVERY) {
            return;
        }
        s.cut_at = Some(Instant::now());
        let before = s.limit;
        let to = (s.limit / 2).max(1);
        self.shrink(&mut s, to);
        log::info!("uploads in flight: at most {} (was {before}): {e}", s.limit);
    }

    /// Lowers the limit to `to`: free places go now, the rest as uploads end.
    fn shrink(&self, s: &mut WindowState, to: usize) {
        let mut cut = s.limit.saturating_sub(to);
        s.limit = to.min(s.limit);
        while cut > 0 {
            match self.permits.try_acquire() {
                Ok(p) => p.forget(),
                Err(_) => break,
            }
            cut -= 1;
        }
        s.debt += cut;
    }

    /// The uploads that may be in flight now.
    #[cfg(test)]
    fn limit(&self) -> usize {
        relock(&self.state).limit
    }
}

/// Upload step 1 for `ino` when it is new (no remote file yet), with the other new files of
/// its folder waiting for theirs: the file then has its remote ID, and `upload::upload_once`
/// goes on with step 2. Nothing to do for a file with a remote node, an empty one, or one no
/// longer staged.
pub async fn create_ahead<B: Backend>(fs: &Arc<Fs<B>>, ino: Ino) -> Result<()> {
    // A server that takes a new file whole makes it with its bytes (`Backend::put_whole`).
    if fs.backend.puts_whole() {
        return Ok(());
    }
    let Some(io) = fs.nodes.io(ino) else {
        return Ok(());
    };
    // Not while the file is renamed or removed: its name is what is created.
    let _io = io.lock().await;
    // An empty file is left to `upload_once` whole: a new file's node already says "no
    // bytes", and that would pass for its version being stored.
    let path = fs.nodes.inode(ino, |i| {
        let dirty = (i.staged.as_ref()).is_some_and(|s| s.is_dirty() && s.size() > 0);
        (i.remote.is_none() && !i.unlinked && dirty).then(|| i.path.clone())
    });
    let Some(path) = path.flatten() else {
        return Ok(());
    };
    let (Some(folder), Some(name)) = (path.parent(), path.name()) else {
        return Ok(());
    };
    let file = create(fs, &folder, name).await?;
    if file.file_id().is_none() {
        return Err(Error::internal("create_file returned no file ID"));
    }
    fs.nodes.update_from(ino, &file);
    Ok(())
}

/// `create_file` of `name` in `folder`, in one request with the other names waiting there.
async fn create<B: Backend>(fs: &Arc<Fs<B>>, folder: &NodePath, name: &str) -> Result<Node> {
    let (tx, rx) = oneshot::channel();
    let lead = {
        let mut creating = relock(&fs.uploads.pacing.creating);
        match creating.get_mut(folder) {
            Some(waiting) => {
                waiting.push((name.to_string(), tx));
                false
            }
            None => {
                creating.insert(folder.clone(), vec![(name.to_string(), tx)]);
                true
            }
        }
    };
    if lead {
        // A task of its own: the first caller may go away, the others still get answers.
        let (fs, folder) = (fs.clone(), folder.clone());
        fs.rt
            .clone()
            .spawn(async move { send_batches(&fs, &folder).await });
    }
    rx.await
        .unwrap_or_else(|_| Err(Error::internal("the create_file batch ended unanswered")))
}

/// Sends the names waiting in `folder`, batch after batch, until none is left.
async fn send_batches<B: Backend>(fs: &Arc<Fs<B>>, folder: &NodePath) {
    loop {
        let batch = {
            let mut creating = relock(&fs.uploads.pacing.creating);
            let Some(waiting) = creating.get_mut(folder) else {
                return;
            };
            if waiting.is_empty() {
                creating.remove(folder);
                return;
            }
            let (mut n, mut bytes) = (0, 0);
            while n < waiting.len() && n < MAX_BATCH && bytes < MAX_BATCH_BYTES {
                bytes += waiting[n].0.len() + 16;
                n += 1;
            }
            waiting.drain(..n).collect::<Vec<Waiter>>()
        };
        let names: Vec<String> = batch.iter().map(|(n, _)| n.clone()).collect();
        if names.len() > 1 {
            log::debug!("create_file of {} files in {folder}", names.len());
        }
        match fs.backend.create_files(folder, &names).await {
            Ok(answers) => {
                for ((_, tx), r) in batch.into_iter().zip(answers) {
                    let _ = tx.send(r);
                }
            }
            Err(e) => {
                for (_, tx) in batch {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task that takes a place once one frees and gives it back at once; returned once it
    /// waits for its place.
    async fn one_waiting(w: &Arc<Window>) -> tokio::task::JoinHandle<()> {
        let w2 = w.clone();
        let task = tokio::spawn(async move {
            let _s = w2.acquire().await;
        });
        while relock(&w.state).waiting == 0 {
            tokio::task::yield_now().await;
        }
        task
    }

    #[tokio::test]
    async fn the_window_grows_while_uploads_wait_and_halves_once_on_a_burst_of_refusals() {
        let w = Arc::new(Window::new(2));
        let a = w.acquire().await;
        let b = w.acquire().await;
        let third = one_waiting(&w).await;
        w.succeeded();
        assert_eq!(w.limit(), 3);
        third.await.unwrap();
        // Nobody waits: no growth.
        w.succeeded();
        assert_eq!(w.limit(), 3);
        let busy = Error::new(ErrorKind::Unavailable, "too_many_transfers", "busy");
        w.failed(&busy);
        w.failed(&busy);
        assert_eq!(w.limit(), 1);
        // A refused file is not the server's load.
        let refused = Error::new(ErrorKind::BadRequest, "bad", "bad");
        relock(&w.state).cut_at = None;
        w.failed(&refused);
        assert_eq!(w.limit(), 1);
        // Two places were taken when the window went from 3 to 1: the first back is forgotten.
        drop(a);
        assert_eq!(w.permits.available_permits(), 0);
        drop(b);
        assert_eq!(w.permits.available_permits(), 1);
    }

    #[tokio::test]
    async fn the_window_grows_only_while_the_server_answers_quickly_and_eases_while_it_queues() {
        let ms = Duration::from_millis;
        let w = Arc::new(Window::new(8));
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(w.acquire().await);
        }
        let more = one_waiting(&w).await;
        // Quick answers (the first sets the base): room to grow.
        w.answered(ms(10));
        w.succeeded();
        assert_eq!(w.limit(), 9);
        more.await.unwrap();
        held.push(w.acquire().await);
        let more = one_waiting(&w).await;
        // Slower than twice the base, not yet four times: no growth, no cut.
        w.answered(ms(30));
        w.succeeded();
        assert_eq!(w.limit(), 9);
        // Queued (over four times the base): one place given back a round trip, not one for
        // each answer of the same round trip ...
        w.answered(ms(80));
        w.answered(ms(80));
        assert_eq!(w.limit(), 8);
        // ... and never below the floor.
        for _ in 0..20 {
            relock(&w.state).eased_at = None;
            w.answered(ms(80));
        }
        assert_eq!(w.limit(), MIN_WINDOW);
        // Every place given back is taken from the uploads in flight as they end.
        drop(held);
        more.await.unwrap();
        assert_eq!(w.permits.available_permits(), MIN_WINDOW);
        // A quicker answer is the new base: a link that got faster grows again.
        w.answered(ms(1));
        assert!(relock(&w.state).quick);
    }
}
