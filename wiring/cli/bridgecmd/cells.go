package bridgecmd

import (
	"log/slog"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/client/cellmap"
)

// cells loads --cell-map into cfg.Cells and returns its watcher, whose
// Run the command owns (nil without --cell-map).
func (f *flags) cells(cfg *bridge.Config, log *slog.Logger) (*cellmap.Watcher, error) {
	if f.cellMap == "" {
		return nil, nil
	}
	w, err := cellmap.NewWatcher(cellmap.WatcherConfig{Path: f.cellMap, Logger: log.With("component", "cellmap")})
	if err != nil {
		return nil, err
	}
	cfg.Cells, cfg.Topic = w, ""
	return w, nil
}
