#include "gm_config.h"
