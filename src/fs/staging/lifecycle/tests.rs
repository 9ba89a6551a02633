//! The staged file's life without a kernel: every step from every state, taken or refused;
//! each step as the mount takes it, over the fault-injecting backend (both uploaders: the
//! built-in store's batches and file by file); and the races found in its seams.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use fuser::{OpenFlags, RenameFlags};

use crate::api::{Error, ErrorKind};
use crate::backend::faulty::{Fault, Op};
use crate::fs::staging::Staged;
use crate::fs::staging::state::{Illegal, Life};
use crate::fs::table::{Ino, ROOT};
use crate::fs::tests::{Harness, TTL, eventually, harness};

/// A staged file of nobody's, as `Journal::create` makes one: no writer, nothing written.
fn bare(dir: &Path, id: u64) -> Staged {
    let path = dir.join(format!("{id}.data"));
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    Staged::new(id, path, 0, false, crate::api::Base::Any)
}

/// A staged file brought to `life` by legal steps.
fn in_state(dir: &Path, id: u64, life: Life) -> Staged {
    let s = bare(dir, id);
    match life {
        Life::Closed => {}
        Life::Open => s.join().unwrap(),
        Life::Retired => s.retire().unwrap(),
        Life::Dropped => s.drop_copy().unwrap(),
        Life::SetAside => s.set_aside().unwrap(),
    }
    assert_eq!(s.life(), life);
    s
}

const ALL: [Life; 5] = [
    Life::Open,
    Life::Closed,
    Life::Retired,
    Life::Dropped,
    Life::SetAside,
];

type Step = fn(&Staged) -> Result<(), Illegal>;

#[test]
fn every_step_is_taken_from_the_states_it_may_be_and_refused_from_the_others() {
    use Life::*;
    let dir = tempfile::tempdir().unwrap();
    // Each step, and where it leads from each state (None: refused). The files are clean:
    // nothing written since their last (or no) upload; an Open one has one writer.
    let steps: [(&str, Step, [Option<Life>; 5]); 7] = [
        (
            "join",
            |s| s.join(),
            [Some(Open), Some(Open), None, None, None],
        ),
        (
            "leave",
            |s| s.leave().map(drop),
            [Some(Closed), None, None, None, None],
        ),
        (
            "take the stored bytes",
            |s| s.holds_stored(),
            [None, Some(Closed), None, None, None],
        ),
        (
            "be stored",
            |s| s.stored(s.generation()),
            [Some(Open), Some(Closed), None, None, None],
        ),
        (
            "retire",
            |s| s.retire(),
            [None, Some(Retired), None, None, None],
        ),
        (
            "drop",
            |s| s.drop_copy(),
            [None, Some(Dropped), None, None, None],
        ),
        (
            "set aside",
            |s| s.set_aside(),
            [Some(SetAside), Some(SetAside), None, None, None],
        ),
    ];
    let mut id = 0;
    for (name, step, to) in steps {
        for (from, to) in ALL.into_iter().zip(to) {
            id += 1;
            let s = in_state(dir.path(), id, from);
            let writers = s.has_writers();
            match (step(&s), to) {
                (Ok(()), Some(to)) => assert_eq!(s.life(), to, "{name} from {from:?}"),
                (Err(e), None) => {
                    assert_eq!((e.step, e.from, e.writers > 0), (name, from, writers));
                    assert_eq!(s.life(), from, "{name} from {from:?} refused, yet moved");
                    assert_eq!(s.has_writers(), writers);
                }
                (r, to) => panic!("{name} from {from:?}: {r:?}, expected {to:?}"),
            }
        }
    }
}

#[test]
fn a_file_is_retired_only_clean_and_stored_only_up_to_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let s = bare(dir.path(), 1);
    s.write_at(0, b"new").unwrap();
    let written = s.generation();
    // Dirty: not retired, and no generation past the last one can have been stored.
    assert_eq!(s.retire().map_err(|e| e.from), Err(Life::Closed));
    assert!(s.stored(written + 1).is_err());
    assert!(s.is_dirty());
    s.stored(written).unwrap();
    assert!(!s.is_dirty());
    // A writer holds it: not retired nor dropped until it leaves.
    s.join().unwrap();
    assert!(s.retire().is_err() && s.drop_copy().is_err());
    assert_eq!(s.leave(), Ok(true));
    s.retire().unwrap();
    assert!(s.join().is_err(), "no writer joins a retired file");
}

#[test]
fn a_writer_of_a_file_set_aside_may_still_leave_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = bare(dir.path(), 1);
    s.join().unwrap();
    s.join().unwrap();
    s.set_aside().unwrap();
    assert!(s.join().is_err());
    assert_eq!(s.leave(), Ok(false));
    assert_eq!(s.leave(), Ok(true));
    assert_eq!(s.life(), Life::SetAside);
    assert!(s.leave().is_err(), "more leaves than joins");
}

fn staged_of(h: &Harness, ino: Ino) -> Option<Arc<Staged>> {
    h.fs.nodes.staged(ino)
}

/// The call each uploader makes for a file's bytes.
fn store_op(one_by_one: bool) -> Op {
    if one_by_one { Op::Upload } else { Op::PutFiles }
}

const RDWR: OpenFlags = OpenFlags(libc::O_RDWR);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_written_file_is_open_then_closed_until_stored_then_retired_by_either_uploader() {
    for one_by_one in [false, true] {
        let h = harness(one_by_one, TTL);
        h.faults().inject_times(
            store_op(one_by_one),
            Fault::Delay(Duration::from_millis(300)),
            1,
        );
        let (ino, fh) = h.create("a.txt").await;
        let s = staged_of(&h, ino).unwrap();
        assert_eq!(s.life(), Life::Open);
        h.fs.write(fh, 0, b"hello").unwrap();
        h.fs.release(fh);
        // Settled: dirty, journaled, its upload under way; still what the file reads.
        assert_eq!(s.life(), Life::Closed);
        assert!(s.is_dirty());
        assert_eq!(h.fs.journal.len(), 1);
        assert!(staged_of(&h, ino).is_some_and(|c| Arc::ptr_eq(&c, &s)));
        eventually(Duration::from_secs(5), "retired", || async {
            s.life() == Life::Retired
        })
        .await;
        assert!(!s.is_dirty());
        assert!(staged_of(&h, ino).is_none());
        assert_eq!(h.stored("a.txt").await.as_deref(), Some(&b"hello"[..]));
        eventually(Duration::from_secs(5), "journal entry ended", || async {
            h.fs.journal.len() == 0
        })
        .await;
        assert_eq!(h.read_all(ino).await.unwrap(), b"hello");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_opened_for_writing_and_left_as_it_was_is_retired_at_its_close_unstored() {
    let h = harness(false, TTL);
    let ino = h.write_file(ROOT, "same.txt", b"as it was").await;
    let puts = h.faults().calls(Op::PutFiles);
    let opened = h.fs.open(ino, RDWR).await.unwrap();
    let s = staged_of(&h, ino).unwrap();
    assert_eq!(s.life(), Life::Open);
    assert!(!s.is_dirty(), "a copy of the stored bytes is no change");
    h.fs.release(opened.fh);
    assert_eq!(s.life(), Life::Retired);
    assert!(staged_of(&h, ino).is_none());
    // Refused a writer from now on: the next open stages the file afresh.
    assert!(s.join().is_err());
    let again = h.fs.open(ino, RDWR).await.unwrap();
    let fresh = staged_of(&h, ino).unwrap();
    assert!(!Arc::ptr_eq(&fresh, &s));
    assert_eq!(h.read_all(ino).await.unwrap(), b"as it was");
    h.fs.release(again.fh);
    assert_eq!(h.faults().calls(Op::PutFiles), puts, "nothing stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_cannot_be_stored_yet_stays_closed_and_dirty_then_is_stored() {
    for one_by_one in [false, true] {
        let h = harness(one_by_one, TTL);
        h.faults().inject(store_op(one_by_one), Fault::transport());
        let (ino, fh) = h.create("later.txt").await;
        h.fs.write(fh, 0, b"later").unwrap();
        h.fs.release(fh);
        let s = staged_of(&h, ino).unwrap();
        eventually(Duration::from_secs(5), "tried", || async {
            h.faults().calls(store_op(one_by_one)) >= 1
        })
        .await;
        assert_eq!((s.life(), s.is_dirty()), (Life::Closed, true));
        h.faults().clear_all();
        eventually(Duration::from_secs(10), "retired once stored", || async {
            s.life() == Life::Retired
        })
        .await;
        assert_eq!(h.stored("later.txt").await.as_deref(), Some(&b"later"[..]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_refused_for_good_is_set_aside_after_three_attempts() {
    for one_by_one in [false, true] {
        let h = harness(one_by_one, TTL);
        let refused = Error::new(ErrorKind::Forbidden, "forbidden", "refused (injected)");
        let op = if one_by_one {
            Op::CreateFile
        } else {
            Op::PutFiles
        };
        h.faults().inject(op, Fault::Fail(refused));
        let (ino, fh) = h.create("refused.txt").await;
        h.fs.write(fh, 0, b"keep me").unwrap();
        h.fs.release(fh);
        let s = staged_of(&h, ino).unwrap();
        eventually(Duration::from_secs(15), "set aside", || async {
            s.life() == Life::SetAside
        })
        .await;
        assert_eq!(
            h.faults().calls(op),
            3,
            "one call per attempt, three attempts"
        );
        let lost = h.cache_dir.join("lost+found");
        let entry = std::fs::read_dir(&lost).unwrap().next().unwrap().unwrap();
        assert_eq!(std::fs::read(entry.path()).unwrap(), b"keep me");
        assert!(staged_of(&h, ino).is_none());
        assert_eq!(h.fs.journal.len(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_file_is_dropped_and_never_stored() {
    let h = harness(false, TTL);
    h.faults().inject(Op::PutFiles, Fault::transport());
    // Closed, waiting for its upload: dropped at once.
    let (closed, fh) = h.create("closed.txt").await;
    h.fs.write(fh, 0, b"closed").unwrap();
    h.fs.release(fh);
    let c = staged_of(&h, closed).unwrap();
    // Open: dropped at its last close.
    let (open, fh) = h.create("open.txt").await;
    h.fs.write(fh, 0, b"open").unwrap();
    let o = staged_of(&h, open).unwrap();

    h.fs.unlink(ROOT, "closed.txt").await.unwrap();
    assert_eq!(c.life(), Life::Dropped);
    h.fs.unlink(ROOT, "open.txt").await.unwrap();
    assert_eq!(o.life(), Life::Open, "its writer still writes to it");
    assert_eq!(h.fs.write(fh, 4, b" still"), Ok(6));
    h.fs.release(fh);
    assert_eq!(o.life(), Life::Dropped);
    assert_eq!(h.fs.journal.len(), 0);

    // An upload step refused: a dropped file is never marked stored.
    let marked = h.fs.stored_already(closed, &c, c.generation());
    assert!(!marked);
    assert!(c.is_dirty());

    h.faults().clear_all();
    h.write_file(ROOT, "after.txt", b"after").await;
    assert_eq!(h.stored("closed.txt").await, None);
    assert_eq!(h.stored("open.txt").await, None);
    assert_eq!(h.names(ROOT).await, ["after.txt"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_staged_file_goes_with_its_inode_and_drops_the_one_it_replaces() {
    for one_by_one in [false, true] {
        let h = harness(one_by_one, TTL);
        h.faults().inject(store_op(one_by_one), Fault::transport());
        let mut staged = Vec::new();
        for (name, data) in [("a.txt", b"from a"), ("b.txt", b"from b")] {
            let (ino, fh) = h.create(name).await;
            h.fs.write(fh, 0, data).unwrap();
            h.fs.release(fh);
            staged.push((ino, staged_of(&h, ino).unwrap()));
        }
        let [(a, sa), (_, sb)] = [staged[0].clone(), staged[1].clone()];
        h.fs.rename(ROOT, "a.txt", ROOT, "b.txt", RenameFlags::empty())
            .await
            .unwrap();
        // The moved file keeps its staged bytes, still waiting; the replaced one's are gone.
        assert!(staged_of(&h, a).is_some_and(|s| Arc::ptr_eq(&s, &sa)));
        assert_eq!((sa.life(), sa.is_dirty()), (Life::Closed, true));
        assert_eq!(sb.life(), Life::Dropped);
        assert_eq!(h.fs.journal.len(), 1);
        h.faults().clear_all();
        eventually(
            Duration::from_secs(10),
            "stored under the new name",
            || async { h.stored("b.txt").await.as_deref() == Some(&b"from a"[..]) },
        )
        .await;
        assert_eq!(h.stored("a.txt").await, None);
        eventually(Duration::from_secs(5), "retired", || async {
            sa.life() == Life::Retired
        })
        .await;
    }
}

/// The first race found in these seams (fstests generic/451): the last close counts itself
/// out, an open joins the same copy, and the close's settling then must not drop the copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_after_an_open_joined_leaves_the_copy_open() {
    let h = harness(false, TTL);
    let ino = h.write_file(ROOT, "joined.txt", b"one").await;
    let first = h.fs.open(ino, RDWR).await.unwrap();
    let s = staged_of(&h, ino).unwrap();
    assert_eq!(s.leave(), Ok(true)); // the close, counted out...
    let second = h.fs.open(ino, RDWR).await.unwrap(); // ...an open joins...
    h.fs.settle(ino, &s); // ...and the close settles.
    h.fs.handles().remove(&first.fh);
    assert_eq!(s.life(), Life::Open);
    assert!(staged_of(&h, ino).is_some_and(|c| Arc::ptr_eq(&c, &s)));
    assert_eq!(h.fs.write(second.fh, 0, b"two"), Ok(3));
    h.fs.release(second.fh);
    h.fs.fsync(ino).await.unwrap();
    assert_eq!(h.stored("joined.txt").await.as_deref(), Some(&b"two"[..]));
    assert_eq!(h.read_all(ino).await.unwrap(), b"two");
}

/// The second (fstests generic/451, "stale data from DIO read"): an upload marked the copy
/// clean, and only later gave the inode its new version; a close in between dropped the
/// clean copy, and the next open staged the old bytes. Watched from beside the uploads: under
/// the table's lock, a clean copy's bytes are always the version the inode names. (Not while
/// the test itself opens and writes: bytes being written are new before their generation is,
/// and an O_TRUNC open installs its copy before it empties it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_copy_is_never_clean_while_its_inode_names_an_older_version() {
    for one_by_one in [false, true] {
        let h = harness(one_by_one, TTL);
        let ino = h.write_file(ROOT, "v.txt", b"version 0").await;
        let stop = Arc::new(AtomicBool::new(false));
        let (seen, wrong) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let writing = Arc::new(tokio::sync::RwLock::new(()));
        let watcher = {
            let (fs, stop, seen, wrong) = (h.fs.clone(), stop.clone(), seen.clone(), wrong.clone());
            let writing = writing.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    {
                        let _quiet = writing.blocking_read();
                        fs.nodes.inode(ino, |i| {
                            let (Some(s), Some(r)) = (&i.staged, &i.remote) else {
                                return;
                            };
                            if !s.is_dirty() {
                                seen.fetch_add(1, Ordering::SeqCst);
                                if s.md5().ok() != r.md5 {
                                    wrong.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                        });
                    }
                    std::thread::yield_now();
                }
            })
        };
        for n in 1..=20 {
            let data = format!("version {n}");
            let writes = writing.write().await;
            let fh =
                h.fs.open(ino, OpenFlags(libc::O_RDWR | libc::O_TRUNC))
                    .await
                    .unwrap();
            h.fs.write(fh.fh, 0, data.as_bytes()).unwrap();
            drop(writes);
            h.fs.fsync(ino).await.unwrap();
            // Stored while open: clean, and the inode names the new version (the watcher
            // sees it so before the close retires the copy).
            let before = seen.load(Ordering::SeqCst);
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while seen.load(Ordering::SeqCst) <= before {
                if std::time::Instant::now() > until {
                    let s = staged_of(&h, ino);
                    panic!(
                        "the watcher never saw the stored copy (one by one: {one_by_one}, \
                         round {n}; its life, dirty, generation: {:?} {:?} {:?})",
                        s.as_ref().map(|s| s.life()),
                        s.as_ref().map(|s| s.is_dirty()),
                        s.as_ref().map(|s| s.generation())
                    );
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            h.fs.release(fh.fh);
            assert_eq!(h.read_all(ino).await.unwrap(), data.as_bytes());
        }
        stop.store(true, Ordering::SeqCst);
        watcher.join().unwrap();
        assert_eq!(
            wrong.load(Ordering::SeqCst),
            0,
            "clean copies of another version"
        );
    }
}
