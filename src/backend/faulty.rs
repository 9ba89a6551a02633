//! A backend that fails on purpose, for tests of the mount's logic without a network or a
//! kernel: it wraps another backend (the built-in one over a temporary store) and, per
//! operation, injects errors (a broken connection, a 5xx, any interface error), delays, or a
//! batch the store reports stored and then loses (a server that restarts from before it).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{
    Backend, BatchBounds, Batches, BoxFuture, ByteStream, Download, LocalFile, LocalStore,
    PreviewImage, PutFile,
};
use crate::api::{
    Base, Error, ErrorKind, FileAttrs, Lock, Node, NodePath, PageSize, PreviewMeta, RangeRequest,
    Result,
};
use crate::sync::relock;

/// The calls of [`Backend`] a fault can be aimed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Node,
    List,
    CreateFolder,
    CreateFile,
    BeginVersion,
    SetAttrs,
    Upload,
    Download,
    Copy,
    Rename,
    Delete,
    PutFiles,
    Preview,
}

/// What happens to a call.
#[derive(Debug, Clone)]
pub enum Fault {
    /// It fails with this error, without reaching the wrapped backend.
    Fail(Error),
    /// It waits this long, then goes ahead.
    Delay(Duration),
    /// It is carried out at once, and its answer comes back this much later (what it read
    /// may have changed meanwhile).
    SlowAnswer(Duration),
    /// It is carried out and reported done, then undone: [`Op::PutFiles`] and
    /// [`Op::CreateFolder`] only (what they stored is deleted again).
    Lose,
    /// [`Op::Download`] only: the body sends this many bytes, then nothing more, never ending
    /// (a link gone quiet mid-download).
    StallAfter(u64),
}

impl Fault {
    /// A connection that broke (what a client maps to EIO after its retries).
    pub fn transport() -> Fault {
        Fault::Fail(Error::new(
            ErrorKind::Network,
            "network_error",
            "connection reset by peer (injected)",
        ))
    }

    /// A server error with this HTTP status (500, 503, 507...), classified as a client would.
    pub fn status(status: u16) -> Fault {
        let kind = ErrorKind::from_status(status);
        Fault::Fail(Error::new(
            kind,
            kind.default_code(),
            format!("HTTP {status} (injected)"),
        ))
    }
}

struct Rule {
    op: Op,
    fault: Fault,
    /// Calls it still applies to; `None`: until cleared.
    left: Option<u32>,
}

/// `inner` with faults injected; see [`Faulty::inject`].
pub struct Faulty<B> {
    inner: B,
    rules: Mutex<Vec<Rule>>,
    calls: Mutex<HashMap<Op, u64>>,
    /// Uploads go file by file (three steps) even where `inner` stores batches.
    one_by_one: AtomicBool,
}

/// What the rules say about one call.
#[derive(Default)]
struct Plan {
    delay: Duration,
    answer_delay: Duration,
    fail: Option<Error>,
    lose: bool,
    stall_after: Option<u64>,
}

impl<B: Backend> Faulty<B> {
    pub fn new(inner: B) -> Self {
        Faulty {
            inner,
            rules: Mutex::default(),
            calls: Mutex::default(),
            one_by_one: AtomicBool::new(false),
        }
    }

    /// The same, uploading file by file (`create_file`, version, bytes) although `inner`
    /// stores batches, so the uploader of remote backends is the one tested.
    pub fn one_by_one(inner: B) -> Self {
        let f = Self::new(inner);
        f.one_by_one.store(true, Ordering::SeqCst);
        f
    }

    /// The wrapped backend, as another client of the store sees it.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// From now on, every call of `op` meets `fault` (until [`Faulty::clear`]).
    pub fn inject(&self, op: Op, fault: Fault) {
        self.push(op, fault, None);
    }

    /// The next `n` calls of `op` meet `fault`.
    pub fn inject_times(&self, op: Op, fault: Fault, n: u32) {
        self.push(op, fault, Some(n));
    }

    fn push(&self, op: Op, fault: Fault, left: Option<u32>) {
        relock(&self.rules).push(Rule { op, fault, left });
    }

    /// No more faults for `op`.
    pub fn clear(&self, op: Op) {
        relock(&self.rules).retain(|r| r.op != op);
    }

    /// No more faults at all.
    pub fn clear_all(&self) {
        relock(&self.rules).clear();
    }

    /// How many calls of `op` were made (faulty or not).
    pub fn calls(&self, op: Op) -> u64 {
        *relock(&self.calls).get(&op).unwrap_or(&0)
    }

    /// Counts the call and says what happens to it.
    fn plan(&self, op: Op) -> Plan {
        *relock(&self.calls).entry(op).or_default() += 1;
        let mut rules = relock(&self.rules);
        let mut plan = Plan::default();
        for r in rules.iter_mut().filter(|r| r.op == op) {
            if r.left == Some(0) {
                continue;
            }
            if let Some(n) = &mut r.left {
                *n -= 1;
            }
            match &r.fault {
                Fault::Delay(d) => plan.delay += *d,
                Fault::SlowAnswer(d) => plan.answer_delay += *d,
                Fault::Fail(e) => {
                    plan.fail.get_or_insert_with(|| e.clone());
                }
                Fault::Lose => plan.lose = true,
                Fault::StallAfter(n) => plan.stall_after = Some(*n),
            }
        }
        rules.retain(|r| r.left != Some(0));
        plan
    }

    /// Waits what the plan says; the error it injects, if any.
    async fn enter(&self, op: Op) -> Result<Plan> {
        let plan = self.plan(op);
        if !plan.delay.is_zero() {
            tokio::time::sleep(plan.delay).await;
        }
        match plan.fail {
            Some(e) => Err(e),
            None => Ok(plan),
        }
    }

    /// `call` of the wrapped backend as the faults of `op` say.
    async fn call<T, F>(&self, op: Op, call: impl FnOnce() -> F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        let plan = self.enter(op).await?;
        let r = call().await;
        if !plan.answer_delay.is_zero() {
            tokio::time::sleep(plan.answer_delay).await;
        }
        r
    }
}

/// The wrapped store's batches, with faults.
impl<B: Backend> Batches for Faulty<B> {
    fn put_files(&self, files: Vec<PutFile>) -> BoxFuture<'_, Vec<Result<Node>>> {
        Box::pin(async move {
            let plan = match self.enter(Op::PutFiles).await {
                Ok(p) => p,
                Err(e) => return files.iter().map(|_| Err(e.clone())).collect(),
            };
            let Some(inner) = self.inner.batches() else {
                let e = Error::internal("this backend uploads files one by one");
                return files.iter().map(|_| Err(e.clone())).collect();
            };
            let paths: Vec<NodePath> = files.iter().map(|f| f.path.clone()).collect();
            let results = inner.put_files(files).await;
            if plan.lose {
                for (path, r) in paths.iter().zip(&results) {
                    if r.is_ok() {
                        let _ = self.inner.delete(path).await;
                    }
                }
            }
            tokio::time::sleep(plan.answer_delay).await;
            results
        })
    }

    fn batch_bounds(&self) -> BatchBounds {
        self.inner
            .batches()
            .map_or(BatchBounds { file: 0, total: 0 }, |b| b.batch_bounds())
    }
}

/// The built-in store's other local calls are not offered (a test's listings and opens go
/// through the interface, as a server's would).
impl<B: Backend> LocalStore for Faulty<B> {
    fn local_file<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<LocalFile>>> {
        Box::pin(async { Ok(None) })
    }

    fn read_local<'a>(
        &'a self,
        _: &'a str,
        _: u64,
        _: usize,
    ) -> BoxFuture<'a, Result<Option<super::LocalBytes>>> {
        Box::pin(async { Ok(None) })
    }

    fn foreign_changes(&self) -> Option<u64> {
        None
    }

    fn shared(&self) -> bool {
        self.inner.local().is_some_and(|l| l.shared())
    }
}

impl<B: Backend> Backend for Faulty<B> {
    /// The wrapped store's batches, unless told to upload file by file.
    fn local(&self) -> Option<&dyn LocalStore> {
        match self.inner.local() {
            Some(_) if !self.one_by_one.load(Ordering::SeqCst) => Some(self),
            _ => None,
        }
    }

    /// The same for the wrapped backend's batches.
    fn batches(&self) -> Option<&dyn Batches> {
        match self.inner.batches() {
            Some(_) if !self.one_by_one.load(Ordering::SeqCst) => Some(self),
            _ => None,
        }
    }

    async fn node(&self, path: &NodePath) -> Result<Node> {
        self.call(Op::Node, || self.inner.node(path)).await
    }

    async fn restore_deleted(&self, id: &str) -> Result<Node> {
        self.inner.restore_deleted(id).await
    }

    async fn locks(&self, path: &NodePath) -> Result<Vec<Lock>> {
        self.inner.locks(path).await
    }

    async fn list(&self, path: &NodePath, page: u64, per_page: u64) -> Result<Node> {
        self.call(Op::List, || self.inner.list(path, page, per_page))
            .await
    }

    async fn create_folder(&self, path: &NodePath) -> Result<Node> {
        let plan = self.enter(Op::CreateFolder).await?;
        let node = self.inner.create_folder(path).await?;
        if plan.lose {
            let _ = self.inner.delete(path).await;
        }
        tokio::time::sleep(plan.answer_delay).await;
        Ok(node)
    }

    async fn create_file(&self, folder: &NodePath, name: &str) -> Result<Node> {
        self.call(Op::CreateFile, || self.inner.create_file(folder, name))
            .await
    }

    async fn begin_version_with(
        &self,
        file_id: &str,
        length: u64,
        md5: Option<&str>,
        attrs: FileAttrs,
        base: &Base,
    ) -> Result<Node> {
        self.call(Op::BeginVersion, || {
            self.inner
                .begin_version_with(file_id, length, md5, attrs, base)
        })
        .await
    }

    async fn set_attrs(&self, file_id: &str, attrs: FileAttrs) -> Result<Node> {
        self.call(Op::SetAttrs, || self.inner.set_attrs(file_id, attrs))
            .await
    }

    async fn upload(
        &self,
        file_id: &str,
        version_id: &str,
        length: u64,
        body: ByteStream,
    ) -> Result<Node> {
        self.call(Op::Upload, || {
            self.inner.upload(file_id, version_id, length, body)
        })
        .await
    }

    async fn download(&self, file_id: &str, range: Option<RangeRequest>) -> Result<Download> {
        self.download_sized(file_id, range, None).await
    }

    async fn download_sized(
        &self,
        file_id: &str,
        range: Option<RangeRequest>,
        size: Option<u64>,
    ) -> Result<Download> {
        let plan = self.enter(Op::Download).await?;
        let mut d = self.inner.download_sized(file_id, range, size).await?;
        tokio::time::sleep(plan.answer_delay).await;
        if let Some(n) = plan.stall_after {
            d.body = stall_after(d.body, n);
        }
        Ok(d)
    }

    async fn copy(&self, src: &NodePath, dst: &NodePath, replace: bool) -> Result<Node> {
        self.call(Op::Copy, || self.inner.copy(src, dst, replace))
            .await
    }

    async fn rename(&self, src: &NodePath, dst: &NodePath, replace: bool) -> Result<Node> {
        self.call(Op::Rename, || self.inner.rename(src, dst, replace))
            .await
    }

    async fn delete(&self, path: &NodePath) -> Result<()> {
        self.call(Op::Delete, || self.inner.delete(path)).await
    }

    fn checks_deletes(&self) -> bool {
        self.inner.checks_deletes()
    }

    fn puts_whole(&self) -> bool {
        self.inner.puts_whole()
    }

    async fn put_whole(&self, whole: super::Whole<'_>, body: ByteStream) -> Result<Node> {
        self.call(Op::Upload, || self.inner.put_whole(whole, body))
            .await
    }

    async fn delete_if(&self, path: &NodePath, base: &Base) -> Result<()> {
        self.call(Op::Delete, || self.inner.delete_if(path, base))
            .await
    }

    async fn preview(&self, file_id: &str) -> Result<PreviewMeta> {
        self.call(Op::Preview, || self.inner.preview(file_id)).await
    }

    async fn preview_page(&self, file_id: &str, page: u32, size: PageSize) -> Result<PreviewImage> {
        self.call(Op::Preview, || self.inner.preview_page(file_id, page, size))
            .await
    }

    async fn preview_pdf(&self, file_id: &str) -> Result<Download> {
        self.call(Op::Preview, || self.inner.preview_pdf(file_id))
            .await
    }
}

/// `body`'s first `n` bytes, then a stream that never yields again.
fn stall_after(body: ByteStream, n: u64) -> ByteStream {
    use futures_util::StreamExt;
    let first = futures_util::stream::unfold((body, n), |(mut body, left)| async move {
        if left == 0 {
            return None;
        }
        let item = body.next().await?;
        let item = item.map(|mut b| {
            b.truncate(b.len().min(left as usize));
            b
        });
        let left = left - item.as_ref().map_or(0, |b| b.len() as u64);
        Some((item, (body, left)))
    });
    Box::pin(first.chain(futures_util::stream::pending()))
}
