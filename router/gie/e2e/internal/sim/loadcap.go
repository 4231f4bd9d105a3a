package sim

// LoadCap is the load cap every strategy runs behind: over the last
// Window requests, a pod that has taken more than Slack times its share
// (Window / pods) is removed from the candidates of the next request
// before the router sees it. It is the load balancer's, shared by all the
// router instances of a run. Not safe for concurrent use.
type LoadCap struct {
	limit  float64
	ring   []int
	next   int
	full   bool
	counts []int
}

// NewLoadCap returns a cap over pods pods with a window of window
// requests and the given slack (a pod may take up to slack x window/pods
// of the window). window 0 turns the cap off.
func NewLoadCap(pods, window int, slack float64) *LoadCap {
	return &LoadCap{limit: slack * float64(window) / float64(pods), ring: make([]int, window), counts: make([]int, pods)}
}

// Allowed reports, per pod, whether it may take the next request. At
// least one pod is always allowed (the counts of a window sum to at most
// window, so some pod is at or below its share).
func (c *LoadCap) Allowed() []bool {
	out := make([]bool, len(c.counts))
	for i, n := range c.counts {
		out[i] = len(c.ring) == 0 || float64(n+1) <= c.limit
	}
	any := false
	for _, ok := range out {
		any = any || ok
	}
	if !any {
		// A slack below 1 can exclude everyone: fall back to the least
		// loaded pods.
		least := c.counts[0]
		for _, n := range c.counts {
			least = min(least, n)
		}
		for i, n := range c.counts {
			out[i] = n == least
		}
	}
	return out
}

// Add records that pod took a request.
func (c *LoadCap) Add(pod int) {
	if len(c.ring) == 0 {
		return
	}
	if c.full {
		c.counts[c.ring[c.next]]--
	}
	c.ring[c.next] = pod
	c.counts[pod]++
	c.next++
	if c.next == len(c.ring) {
		c.next, c.full = 0, true
	}
}
