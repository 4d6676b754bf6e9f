//! Arena planning: every activation gets an offset in one buffer, and two
//! values share bytes only if their lifetimes do not overlap.

/// One value to place: `bytes` long, live from step `first` through `last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferRequest {
    pub bytes: usize,
    pub first: usize,
    pub last: usize,
}

impl BufferRequest {
    fn overlaps_in_time(&self, o: &BufferRequest) -> bool {
        self.first <= o.last && o.first <= self.last
    }
}

/// Offsets for each request and the arena size they need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    pub offsets: Vec<usize>,
    pub arena_bytes: usize,
}

/// Greedy best-fit by size: the largest values are placed first, each at the
/// lowest aligned offset that no time-overlapping, already-placed value uses.
pub fn plan_memory(reqs: &[BufferRequest], align: usize) -> MemoryPlan {
    let align = align.max(1);
    let round = |n: usize| n.div_ceil(align) * align;
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by(|&a, &b| {
        reqs[b]
            .bytes
            .cmp(&reqs[a].bytes)
            .then(reqs[a].first.cmp(&reqs[b].first))
    });
    let mut offsets = vec![0usize; reqs.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(reqs.len());
    let mut arena = 0;
    for &i in &order {
        let r = &reqs[i];
        let size = round(r.bytes);
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| reqs[j].overlaps_in_time(r))
            .map(|&j| (offsets[j], offsets[j] + round(reqs[j].bytes)))
            .collect();
        busy.sort_unstable();
        let mut at = 0;
        for (start, end) in busy {
            if at + size <= start {
                break;
            }
            at = at.max(end);
        }
        offsets[i] = at;
        arena = arena.max(at + size);
        placed.push(i);
    }
    MemoryPlan {
        offsets,
        arena_bytes: arena,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn requests() -> impl Strategy<Value = Vec<BufferRequest>> {
        prop::collection::vec((0usize..5000, 0usize..40, 0usize..15), 0..60).prop_map(|v| {
            v.into_iter()
                .map(|(bytes, first, len)| BufferRequest {
                    bytes,
                    first,
                    last: first + len,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn live_values_never_overlap(reqs in requests(), align in prop::sample::select(vec![1usize, 4, 64])) {
            let plan = plan_memory(&reqs, align);
            for (i, a) in reqs.iter().enumerate() {
                let oa = plan.offsets[i];
                prop_assert_eq!(oa % align, 0);
                prop_assert!(oa + a.bytes <= plan.arena_bytes);
                for (j, b) in reqs.iter().enumerate().skip(i + 1) {
                    if a.bytes == 0 || b.bytes == 0 || !a.overlaps_in_time(b) {
                        continue;
                    }
                    let ob = plan.offsets[j];
                    prop_assert!(
                        oa + a.bytes <= ob || ob + b.bytes <= oa,
                        "values {} and {} overlap: {:?}@{} and {:?}@{}", i, j, a, oa, b, ob
                    );
                }
            }
        }
    }

    #[test]
    fn values_with_disjoint_lifetimes_share_memory() {
        let reqs = [
            BufferRequest {
                bytes: 100,
                first: 0,
                last: 1,
            },
            BufferRequest {
                bytes: 100,
                first: 2,
                last: 3,
            },
            BufferRequest {
                bytes: 100,
                first: 4,
                last: 5,
            },
        ];
        let plan = plan_memory(&reqs, 1);
        assert_eq!(plan.arena_bytes, 100);
        let overlapping = [
            BufferRequest {
                bytes: 100,
                first: 0,
                last: 2,
            },
            BufferRequest {
                bytes: 50,
                first: 1,
                last: 3,
            },
        ];
        assert_eq!(plan_memory(&overlapping, 1).arena_bytes, 150);
    }
}
