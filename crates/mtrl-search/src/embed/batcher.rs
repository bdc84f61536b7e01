//! Dynamic micro-batching of query embeddings for the vector tool.
//!
//! Many rollout episodes call `vector_search` at once, each with one short query. Embedding them
//! one at a time runs every product of the encoder on a handful of rows; a batch of 64 queries
//! runs the same products on hundreds of rows, which the CPU does many times faster per row.
//!
//! Policy (continuous batching with a bounded wait): one worker thread takes the first queued
//! query, then keeps collecting until the batch holds `max_batch` texts, or `max_wait` has passed
//! since the first, or every search in progress (see [`QueryBatcher::enter`]) has queued its
//! query — so a lone caller never waits. While a batch is embedded new queries queue up and form
//! the next batch. A text's vector does not depend on the batch it rides in (the encoders' rows
//! are computed independently), so batched and unbatched searches return the same hits.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::Embedder;
use crate::error::{Result, SearchError};

type Reply = mpsc::SyncSender<Result<Vec<f32>>>;

struct Job {
    text: String,
    reply: Reply,
}

#[derive(Default)]
struct Shared {
    /// Searches between [`QueryBatcher::enter`] and the drop of its guard.
    active: AtomicUsize,
    batches: AtomicU64,
    texts: AtomicU64,
}

/// Counters of a batcher: how many forward passes embedded how many queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchStats {
    pub batches: u64,
    pub texts: u64,
}

/// Embeds single queries in dynamic batches on a worker thread. Dropping it stops the worker
/// once the queued queries are answered.
pub struct QueryBatcher {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    shared: Arc<Shared>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Marks a search in progress (see [`QueryBatcher::enter`]).
pub struct InSearch<'a>(&'a Shared);

impl Drop for InSearch<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl QueryBatcher {
    /// A batcher over `inner` that embeds at most `max_batch` queries per pass and holds a batch
    /// open at most `max_wait`.
    pub fn new(inner: Arc<dyn Embedder>, max_batch: usize, max_wait: Duration) -> QueryBatcher {
        let (tx, rx) = mpsc::channel::<Job>();
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let max_batch = max_batch.max(1);
        let worker = std::thread::Builder::new()
            .name("mtrl-query-batcher".into())
            .spawn(move || run(inner.as_ref(), &rx, &s, max_batch, max_wait))
            .ok();
        QueryBatcher {
            tx: Mutex::new(worker.as_ref().map(|_| tx)),
            shared,
            worker: Mutex::new(worker),
        }
    }

    /// Call at the start of a search that will embed a query; the batch it joins is not held
    /// open for searches that have already queued theirs.
    pub fn enter(&self) -> InSearch<'_> {
        self.shared.active.fetch_add(1, Ordering::AcqRel);
        InSearch(&self.shared)
    }

    /// The unit vector of `text`, embedded together with whatever other queries are waiting.
    pub fn embed(&self, text: &str) -> Result<Vec<f32>> {
        let (reply, rx) = mpsc::sync_channel(1);
        let job = Job {
            text: text.to_string(),
            reply,
        };
        let stopped = || SearchError::InvalidArgument("the query batcher has stopped".into());
        {
            let tx = self.tx.lock().map_err(|_| stopped())?;
            tx.as_ref()
                .ok_or_else(stopped)?
                .send(job)
                .map_err(|_| stopped())?;
        }
        rx.recv().map_err(|_| stopped())?
    }

    pub fn stats(&self) -> BatchStats {
        BatchStats {
            batches: self.shared.batches.load(Ordering::Relaxed),
            texts: self.shared.texts.load(Ordering::Relaxed),
        }
    }
}

impl Drop for QueryBatcher {
    fn drop(&mut self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Some(w) = self.worker.lock().ok().and_then(|mut w| w.take()) {
            let _ = w.join();
        }
    }
}

fn run(
    inner: &dyn Embedder,
    rx: &mpsc::Receiver<Job>,
    shared: &Shared,
    max_batch: usize,
    max_wait: Duration,
) {
    while let Ok(first) = rx.recv() {
        let deadline = Instant::now() + max_wait;
        let mut jobs = vec![first];
        while jobs.len() < max_batch {
            // Whatever is queued already joins at once.
            match rx.try_recv() {
                Ok(j) => {
                    jobs.push(j);
                    continue;
                }
                Err(mpsc::TryRecvError::Disconnected) => break,
                Err(mpsc::TryRecvError::Empty) => {}
            }
            // Wait only for searches in progress that have not queued yet.
            let now = Instant::now();
            if shared.active.load(Ordering::Acquire) <= jobs.len() || now >= deadline {
                break;
            }
            match rx.recv_timeout((deadline - now).min(Duration::from_micros(200))) {
                Ok(j) => jobs.push(j),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let texts: Vec<&str> = jobs.iter().map(|j| j.text.as_str()).collect();
        shared.batches.fetch_add(1, Ordering::Relaxed);
        shared.texts.fetch_add(jobs.len() as u64, Ordering::Relaxed);
        match inner.embed(&texts) {
            Ok(vectors) if vectors.len() == jobs.len() => {
                for (j, v) in jobs.into_iter().zip(vectors) {
                    let _ = j.reply.send(Ok(v));
                }
            }
            Ok(vectors) => {
                let msg = format!(
                    "embedder returned {} vectors for {} texts",
                    vectors.len(),
                    jobs.len()
                );
                for j in jobs {
                    let _ = j.reply.send(Err(SearchError::InvalidArgument(msg.clone())));
                }
            }
            Err(e) => {
                let msg = e.to_string();
                for j in jobs {
                    let _ = j.reply.send(Err(SearchError::InvalidArgument(msg.clone())));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::HashEmbedder;

    #[test]
    fn batched_vectors_equal_unbatched_and_batches_form() {
        let inner: Arc<dyn Embedder> = Arc::new(HashEmbedder::new(32));
        let b = Arc::new(QueryBatcher::new(
            inner.clone(),
            16,
            Duration::from_millis(50),
        ));
        let texts: Vec<String> = (0..64).map(|i| format!("query number {i} wing")).collect();
        // 64 searches "in progress" at once: they fill batches of up to 16.
        b.shared.active.fetch_add(64, Ordering::AcqRel);
        std::thread::scope(|s| {
            for t in &texts {
                let (b, inner) = (&b, &inner);
                s.spawn(move || {
                    let got = b.embed(t).unwrap();
                    assert_eq!(got, inner.embed(&[t]).unwrap()[0]);
                });
            }
        });
        b.shared.active.fetch_sub(64, Ordering::AcqRel);
        let st = b.stats();
        assert_eq!(st.texts, 64);
        assert!(st.batches < 64, "{st:?}");
        // A lone caller does not wait for a batch to fill (it would wait 60 s here).
        let lone = QueryBatcher::new(inner, 16, Duration::from_secs(60));
        let t = Instant::now();
        let _g = lone.enter();
        lone.embed("alone").unwrap();
        assert!(t.elapsed() < Duration::from_secs(30));
    }

    #[test]
    fn a_batch_waits_up_to_max_wait_for_searches_in_progress() {
        let b = QueryBatcher::new(
            Arc::new(HashEmbedder::new(8)),
            16,
            Duration::from_millis(300),
        );
        // Two searches in progress, only one queues: the batch is held open for the other until
        // the wait runs out.
        let (_a, _b) = (b.enter(), b.enter());
        let t = Instant::now();
        b.embed("first").unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn max_batch_one_embeds_one_at_a_time() {
        let b = QueryBatcher::new(Arc::new(HashEmbedder::new(8)), 1, Duration::from_millis(5));
        std::thread::scope(|s| {
            for i in 0..8 {
                let b = &b;
                s.spawn(move || b.embed(&format!("q{i}")).unwrap());
            }
        });
        assert_eq!(
            b.stats(),
            BatchStats {
                batches: 8,
                texts: 8
            }
        );
    }
}
