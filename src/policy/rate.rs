//! Rate limits as a sliding window (SPEC 6.3 r2). PLACEHOLDER until the policy branch lands.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    calls: u32,
    per_ms: i64,
}

impl SlidingWindow {
    pub fn new(calls: u32, per_seconds: u32) -> SlidingWindow {
        SlidingWindow {
            calls: calls.max(1),
            per_ms: i64::from(per_seconds.max(1)) * 1000,
        }
    }

    fn times(state: Option<&[u8]>) -> Vec<i64> {
        state
            .unwrap_or_default()
            .chunks_exact(8)
            .map(|c| i64::from_be_bytes(c.try_into().unwrap_or_default()))
            .collect()
    }

    pub fn admit(&self, state: Option<&[u8]>, now_ms: i64) -> Result<Vec<u8>, i64> {
        let mut times: Vec<i64> = Self::times(state)
            .into_iter()
            .filter(|t| *t > now_ms - self.per_ms)
            .collect();
        if times.len() >= self.calls as usize {
            return Err((times[0] + self.per_ms - now_ms).max(1));
        }
        times.push(now_ms);
        Ok(times.iter().flat_map(|t| t.to_be_bytes()).collect())
    }

    pub fn refund(&self, state: &[u8], admitted_at_ms: i64) -> Vec<u8> {
        let mut times = Self::times(Some(state));
        if let Some(i) = times.iter().rposition(|t| *t == admitted_at_ms) {
            times.remove(i);
        }
        times.iter().flat_map(|t| t.to_be_bytes()).collect()
    }
}
